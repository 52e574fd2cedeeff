"""LoRA training through ``python -m flaxzoo.train``'s loop (``init_from`` + ``lora.*``) on a tiny pretrained Llama-layout
base written by ``save_pretrained``: only the adapters train, the checkpoint holds only them and the base's
fingerprint, resume is exact, another base is refused, and the work directory loads / exports as the merged model."""

import json
import pathlib

import numpy as np
import pytest
from flax import nnx

from flaxzoo import models
from flaxzoo.models.io import load_adapted
from flaxzoo.models.adapters.lora import has_lora
from flaxzoo.models.modeling import create_model
from flaxzoo.train.checkpoint import CheckpointError, read_meta
from flaxzoo.train.config import ConfigError, TrainConfig
from flaxzoo.train.pretrain import Trainer, train

REPO = pathlib.Path(__file__).resolve().parent.parent
PROMPT = np.asarray([[5, 17, 99, 3, 250, 41]], np.int32)


def save_base(directory: pathlib.Path, seed: int) -> pathlib.Path:
    """A tiny Llama (vocab 512) as a Hugging Face directory with a BPE tokenizer trained on the embedded corpus."""
    from flaxzoo.train.data.corpus import embedded_documents
    from flaxzoo.train.tokenizer import train_tokenizer

    config = models.get_preset("llama-tiny").replace(vocab_size=512, max_position_embeddings=64)
    models.save_pretrained(create_model(config, seed=seed), directory)
    train_tokenizer(embedded_documents()[:400], "bpe", 512).save(directory / "tokenizer.json")
    return directory


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_base(tmp_path_factory.mktemp("lora_base") / "base", seed=3)


def lora_config(base, data_dir, **overrides):
    import importlib.util

    spec = importlib.util.spec_from_file_location("lora_smollm2", REPO / "configs" / "lora_smollm2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    values = {"init_from": str(base), "steps": 4, "seq_len": 32, "batch_size": 4, "log_every": 1, "eval_every": 0,
              "eval_batches": 1, "checkpoint_every": 2, "optim.warmup_steps": 1, "data.data_dir": str(data_dir),
              "sample.max_new_tokens": 0, "lora.rank": 4, "lora.alpha": 8.0, **overrides}
    for key, value in values.items():
        node = config
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return config


def losses(workdir):
    rows = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


TABLE = ("backbone", "embeddings", "tokens", "embedding")


@pytest.mark.slow
def test_lora_run_trains_adapters_only_resumes_exactly_refuses_another_base_and_exports(base_dir, tmp_path):
    """One LoRA run (attention + MLP adapters, the token table trained in full: ``lora.train_fully=embeddings``),
    checked for what trains, what the checkpoint holds, exact resume, the base fingerprint, and both exports."""
    torch = pytest.importorskip("torch")
    import orbax.checkpoint as ocp
    import peft
    import transformers
    from flax import traverse_util

    from flaxzoo.models.io.convert import main as convert_main

    data = tmp_path / "data"
    config = lora_config(base_dir, data, **{"lora.train_fully": "embeddings"})
    trainer = Trainer(config, tmp_path / "probe")
    state, _ = trainer.initial_state()
    trained_names = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.State(state["params"]))}
    assert trained_names == {n for n in trained_names if n.endswith(("kernel_lora_a", "kernel_lora_b"))} | {
        ".".join(TABLE)}
    # rank 4 · (in + out) for query 64→64, key and value 64→32, out 64→64, gate and up 64→128, down 128→64; the table
    assert trainer.trainable_count == 2 * 4 * (128 + 96 + 96 + 128 + 3 * 192) + 512 * 64
    base = models.from_pretrained(base_dir, scan_layers=trainer.model_config.scan_layers)
    base_values = {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(base, nnx.Param))}

    summary = train(config, tmp_path / "once")
    assert summary.trainable_count == trainer.trainable_count < 0.5 * summary.param_count
    step, meta = read_meta(tmp_path / "once")
    assert step == 4 and meta["lora"]["rank"] == 4 and meta["lora"]["train_fully"] == ["embeddings"]
    assert meta["base"]["fingerprint"].startswith("sha256:")
    # The frozen base is not in the checkpoint: its parameters are the adapters and the table (+ Adam moments).
    handler = ocp.PyTreeCheckpointHandler()
    stored = handler.metadata(tmp_path / "once" / "checkpoints" / "4" / "state")
    handler.close()
    stored = {".".join(map(str, k)) for k in traverse_util.flatten_dict(getattr(stored, "tree", stored)["params"])}
    assert stored == trained_names
    # The base stays bit for bit (but the table); every adapter moved; the merged model computes the adapted one.
    adapted = load_adapted(tmp_path / "once")
    frozen = {p: np.asarray(v.get_value()) for p, v in
              nnx.to_flat_state(nnx.state(adapted, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))))}
    assert frozen.keys() == base_values.keys()
    for path, value in base_values.items():
        if path == TABLE:
            assert np.abs(frozen[path] - value).max() > 0
        else:
            np.testing.assert_array_equal(frozen[path], value)
    b = [np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(adapted, nnx.LoRAParam))
         if p[-1] == "kernel_lora_b"]
    assert b and all(np.abs(x).max() > 0 for x in b)  # B starts at zero
    merged = models.from_pretrained(tmp_path / "once")
    assert not has_lora(merged)
    ours = np.asarray(merged(PROMPT))
    np.testing.assert_allclose(ours, np.asarray(adapted(PROMPT)), atol=1e-5)
    assert np.abs(ours - np.asarray(base(PROMPT))).max() > 1e-4

    # The merged export: transformers loads it to the same logits.
    assert convert_main([str(tmp_path / "once"), str(tmp_path / "hf"), "--to", "hf", "--no-progress"]) == 0
    with torch.no_grad():
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
        np.testing.assert_allclose(ours, hf(input_ids=torch.tensor(PROMPT)).logits.numpy(), atol=1e-4)
    # The adapters alone in PEFT's layout, the table as modules_to_save: peft on transformers' base gives the same.
    assert convert_main([str(tmp_path / "once"), str(tmp_path / "peft"), "--to", "hf", "--adapters-only",
                         "--no-progress"]) == 0
    written = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert written["r"] == 4 and written["lora_alpha"] == 8.0 and written["peft_type"] == "LORA"
    assert written["modules_to_save"] == ["model.embed_tokens"]
    with torch.no_grad():
        hf_base = transformers.AutoModelForCausalLM.from_pretrained(base_dir).eval()
        with_adapters = peft.PeftModel.from_pretrained(hf_base, tmp_path / "peft").eval()
        np.testing.assert_allclose(ours, with_adapters(input_ids=torch.tensor(PROMPT)).logits.numpy(), atol=1e-4)

    # Stopped at step 2 and resumed: the same losses, bit for bit; then other base weights are refused.
    config2 = lora_config(base_dir, data, steps=2, **{"lora.train_fully": "embeddings"})
    train(config2, tmp_path / "twice")
    summary = train(config, tmp_path / "twice")
    assert summary.resumed_from == 2
    assert losses(tmp_path / "twice") == losses(tmp_path / "once")
    other = save_base(tmp_path / "other_base", seed=4)
    with pytest.raises(CheckpointError, match="other base weights"):
        train(lora_config(other, data, steps=6, **{"lora.train_fully": "embeddings"}), tmp_path / "twice")


@pytest.mark.parametrize("overrides, key, words", [
    ({"init_from": "", "model.preset": "gpt2-tiny"}, "lora.rank", "init_from is empty"),
    ({"lora.rank": -1}, "lora.rank", "-1"),
    ({"lora.rank": 0, "lora.targets": "mlp"}, "lora.rank", "0 turns LoRA off, but lora.alpha is set"),
    ({"lora.alpha": 0.0}, "lora.alpha", "0"),
    ({"lora.base_dtype": "int4"}, "lora.base_dtype", "int4"),
    ({"lora.targets": "attention,("}, "lora.targets", "valid regular expression"),
    ({"model.hidden_size": 128}, "model.hidden_size", "with init_from the model is the checkpoint's"),
    ({"init_from": "/nonexistent/base"}, "init_from", "does not exist"),
])
def test_bad_lora_training_settings_are_one_clear_error(base_dir, tmp_path, overrides, key, words):
    config = lora_config(base_dir, tmp_path / "data", **overrides)
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")) as info:
        TrainConfig.from_config_dict(config, 1)
    assert info.value.key == key


def test_a_target_matching_nothing_names_the_modules(base_dir, tmp_path):
    config = lora_config(base_dir, tmp_path / "data", **{"lora.targets": "attention,head"})
    with pytest.raises(ConfigError, match="lora.targets: LoRA target 'head' matches no projection") as info:
        Trainer(config, tmp_path / "w")
    assert "attention.query" in str(info.value)
    config = lora_config(base_dir, tmp_path / "data", **{"lora.train_fully": "classifier"})
    with pytest.raises(ConfigError, match="lora.train_fully: 'classifier' matches no module") as info:
        Trainer(config, tmp_path / "w2")
    assert "backbone.embeddings.tokens" in str(info.value)
