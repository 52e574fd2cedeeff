"""ALBERT and ELECTRA against transformers, both ways, on right-padded sentence pairs (the scanned layout proven equal
to the unrolled one once per family), with
factorised embeddings (``embedding_size`` != ``hidden_size``), and ALBERT's cross-layer sharing checked on its own:
one block's parameters, the outputs of a plain stack whose every layer holds them, LoRA / int8 / sharding specs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from flaxzoo.models import BertForMaskedLM, BertModel
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families import FAMILIES, family_and_class
from flaxzoo.models.families.electra import ElectraForPreTraining
from flaxzoo.models.io import from_pretrained
from flaxzoo.models.io.pretrained import check_saveable
from flaxzoo.models.adapters.lora import LoraConfig, apply_lora, dense_modules
from flaxzoo.models.adapters.quantize import is_quantized, module_at, projection_paths, quantize_model
from tests.encoder_parity import check_both_ways, check_encoder_layouts, right_padded, token_types
from tests.family_parity import tiered
from tests.test_every_family import abstract, check_specs

SIZES = dict(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=64)
AUTO = {"base": transformers.AutoModel, "masked_lm": transformers.AutoModelForMaskedLM,
        "sequence_classification": transformers.AutoModelForSequenceClassification,
        "token_classification": transformers.AutoModelForTokenClassification,
        "question_answering": transformers.AutoModelForQuestionAnswering,
        "replaced_token_detection": transformers.AutoModelForPreTraining}
ALBERT_HEADS = {"base": "AlbertModel", "masked_lm": "AlbertForMaskedLM",
                "sequence_classification": "AlbertForSequenceClassification",
                "token_classification": "AlbertForTokenClassification",
                "question_answering": "AlbertForQuestionAnswering"}
ELECTRA_HEADS = {"base": "ElectraModel", "replaced_token_detection": "ElectraForPreTraining",
                 "masked_lm": "ElectraForMaskedLM", "sequence_classification": "ElectraForSequenceClassification",
                 "token_classification": "ElectraForTokenClassification",
                 "question_answering": "ElectraForQuestionAnswering"}


def albert_config(**changes) -> transformers.AlbertConfig:
    return transformers.AlbertConfig(**(SIZES | dict(embedding_size=48, hidden_act="gelu_new", num_labels=3)
                                        | changes))


def electra_config(**changes) -> transformers.ElectraConfig:
    return transformers.ElectraConfig(**(SIZES | dict(embedding_size=16, num_labels=3) | changes))


def build(name: str, config) -> torch.nn.Module:
    torch.manual_seed(0)
    if name.endswith("QuestionAnswering"):
        config.num_labels = 2
    return getattr(transformers, name)(config)


@pytest.mark.parametrize("task", tiered(ALBERT_HEADS, ("masked_lm",)))
def test_albert_both_ways(task, tmp_path):
    loaded, saved = check_both_ways(build(ALBERT_HEADS[task], albert_config()), tmp_path / "hf", tmp_path / "out",
                                    auto=AUTO[task])
    print(f"\n  albert {task}: |Δ| transformers→flaxzoo {loaded:.2e}, flaxzoo→transformers {saved:.2e}")


@pytest.mark.parametrize("task", tiered(ELECTRA_HEADS, ("replaced_token_detection",)))
def test_electra_both_ways(task, tmp_path):
    loaded, saved = check_both_ways(build(ELECTRA_HEADS[task], electra_config()), tmp_path / "hf", tmp_path / "out",
                                    auto=AUTO[task])
    print(f"\n  electra {task}: |Δ| transformers→flaxzoo {loaded:.2e}, flaxzoo→transformers {saved:.2e}")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["albert", "electra"])
def test_scanned_layout_equals_the_unrolled_one(name, tmp_path):
    """The stacked layout (ALBERT: its shared block under a scan) holds, writes and computes what the unrolled one
    does, and gives transformers' outputs (the masked LM: the backbone and the factorised embeddings' projection)."""
    config = albert_config() if name == "albert" else electra_config()
    hf = build(f"{name.capitalize()}ForMaskedLM", config)
    worst = check_encoder_layouts(hf, tmp_path / "hf", tmp_path / "out")
    print(f"\n  {name} masked_lm scanned: |Δ| transformers→flaxzoo {worst:.2e}")


def test_electra_without_projection_and_untied_generator(tmp_path):
    """embedding_size == hidden_size: no ``embeddings_project`` (nor a flaxzoo projection); an untied generator."""
    hf = build("ElectraForMaskedLM", electra_config(embedding_size=32, tie_word_embeddings=False))
    loaded, saved = check_both_ways(hf, tmp_path / "hf", tmp_path / "out", auto=AUTO["masked_lm"], scan=False)
    print(f"\n  electra masked_lm (no projection, untied) unrolled: |Δ| {loaded:.2e}, {saved:.2e}")
    model = from_pretrained(tmp_path / "hf")
    assert model.config.embedding_size is None and model.backbone.embeddings.project is None
    assert model.decoder.kernel is not None and model.decoder.kernel.shape == (32, 300)


def test_the_classes_and_their_tasks():
    albert, electra = FAMILIES["albert"], FAMILIES["electra"]
    assert [c.task for c in albert.classes] == list(ALBERT_HEADS)
    assert [c.task for c in electra.classes] == list(ELECTRA_HEADS)
    assert family_and_class({"model_type": "electra", "architectures": ["ElectraForPreTraining"]}, None) == \
        (electra, ElectraForPreTraining)
    assert family_and_class({"model_type": "albert", "architectures": ["AlbertForMaskedLM"]}, None) == \
        (albert, BertForMaskedLM)


def test_albert_groupings_other_than_one_are_refused():
    for field in ("num_hidden_groups", "inner_group_num"):
        hf = albert_config(**{field: 2}).to_dict()
        with pytest.raises(ValueError, match=rf"{field}=2 is not supported by flaxzoo \(supported: \[1\]\)"):
            FAMILIES["albert"].config_from_hf(hf)


def test_unsaveable_configs_are_named():
    config = FAMILIES["albert"].config_from_hf(albert_config().to_dict())
    with pytest.raises(ValueError, match="embedding_size=None"):
        check_saveable(config.replace(embedding_size=None), FAMILIES["albert"])
    electra = FAMILIES["electra"].config_from_hf(electra_config(hidden_act="relu").to_dict())
    with pytest.raises(ValueError, match="always applies exact GELU"):
        FAMILIES["electra"].weights(electra, BertForMaskedLM, "electra.")
    with pytest.raises(ValueError, match=r"embedding_size=32 == hidden_size"):
        check_saveable(electra.replace(activation="gelu", embedding_size=32), FAMILIES["electra"])
    with pytest.raises(ValueError, match="embedding_size=0: expected a positive integer"):
        electra.replace(embedding_size=0)
    with pytest.raises(ValueError, match="shared_layers=1: expected True or False"):
        electra.replace(shared_layers=1)


# ------------------------------------------------------------------------------------------ cross-layer sharing

@pytest.fixture(scope="module")
def albert() -> TransformerConfig:
    return FAMILIES["albert"].config_from_hf(albert_config(num_hidden_layers=3).to_dict())


def count(model: nnx.Module) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


@nnx.jit
def forward(model, ids, mask, types):
    return model(ids, mask, types)


LAYOUTS = [pytest.param(False, id="unrolled"), pytest.param(True, id="scanned", marks=pytest.mark.slow)]


@pytest.mark.parametrize("scan", LAYOUTS)
def test_one_block_is_shared_by_every_layer(albert, scan):
    """ONE block's parameters (the count does not grow with depth), and the outputs of an unshared stack of three
    layers each holding a copy of them (the plain BERT stack, no sharing code involved)."""
    config = albert.replace(scan_layers=scan)
    model = BertModel(config, rngs=nnx.Rngs(0))
    model.eval()
    paths = [".".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))]
    block = [p for p in paths if p.startswith("backbone.shared_layer.")]
    assert len(block) == 16 and not any(".layers" in p for p in paths)  # q k v out up down (+bias), two norms
    shared = count(model)
    assert shared == count(BertModel(config.replace(num_layers=7), rngs=nnx.Rngs(0)))
    plain_config = config.replace(shared_layers=False, num_layers=1, scan_layers=False)
    assert shared == count(BertModel(plain_config, rngs=nnx.Rngs(0)))

    plain = BertModel(config.replace(shared_layers=False, scan_layers=False), rngs=nnx.Rngs(1))
    plain.eval()
    values = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    flat = []
    for path, var in nnx.to_flat_state(nnx.state(plain, nnx.Param)):
        source = path[:1] + ("shared_layer",) + path[3:] if path[1] == "layers" else path
        flat.append((path, var.replace(values[source])))
    nnx.update(plain, nnx.from_flat_state(flat))
    ids, mask = right_padded(300)
    types = token_types(mask)
    args = (jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32), jnp.asarray(types, jnp.int32))
    ours, theirs = forward(model, *args), forward(plain, *args)
    real = mask.astype(bool)
    assert np.abs(np.asarray(ours.last_hidden_state)).max() > 0.1
    np.testing.assert_allclose(np.asarray(ours.last_hidden_state)[real], np.asarray(theirs.last_hidden_state)[real],
                               atol=1e-5)
    np.testing.assert_allclose(np.asarray(ours.pooler_output), np.asarray(theirs.pooler_output), atol=1e-5)
    one_layer = forward(BertModel(config.replace(num_layers=1), rngs=nnx.Rngs(0)), *args)
    assert np.abs(np.asarray(one_layer.last_hidden_state) - np.asarray(ours.last_hidden_state))[real].max() > 1e-2


@pytest.mark.parametrize("scan", LAYOUTS)
def test_lora_int8_and_sharding_specs_on_the_shared_block(albert, scan):
    config = albert.replace(scan_layers=scan)
    ids, mask = right_padded(300)
    args = (jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32), jnp.asarray(token_types(mask), jnp.int32))
    base = BertForMaskedLM(config, rngs=nnx.Rngs(0))
    base.eval()
    logits = np.asarray(forward(base, *args))

    model = apply_lora(nnx.clone(base), LoraConfig(rank=4, alpha=8.0, targets=("attention", "mlp")), seed=0)
    adapted = sorted(p for p, dense in dense_modules(model).items() if hasattr(dense, "kernel_lora_a"))
    assert adapted == sorted(".".join(map(str, p)) for p in projection_paths(base))
    assert len(adapted) == 6 and all(p.startswith("backbone.shared_layer.") for p in adapted)
    np.testing.assert_array_equal(np.asarray(forward(model, *args)), logits)
    state = nnx.state(model, nnx.LoRAParam)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    nnx.update(model, jax.tree.unflatten(tree, [0.05 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]))
    assert np.abs(np.asarray(forward(model, *args)) - logits).max() > 1e-4

    quantized = quantize_model(nnx.clone(base))
    paths = projection_paths(quantized)
    assert len(paths) == 6 and all(is_quantized(module_at(quantized, p)) for p in paths)
    ours = np.asarray(forward(quantized, *args), np.float64).ravel()
    cosine = ours @ logits.ravel() / (np.linalg.norm(ours) * np.linalg.norm(logits))
    assert cosine >= 0.999

    for cls in FAMILIES["albert"].classes:
        specs = check_specs(abstract(cls, config))
        assert "backbone.shared_layer.attention.query.kernel" in specs
        assert "backbone.embeddings.project.kernel" in specs
    lora = check_specs(abstract(BertForMaskedLM, config,
                                LoraConfig(rank=4, alpha=8.0, targets=("attention", "mlp", "head"))))
    assert any("shared_layer" in name and "lora" in name for name in lora)
