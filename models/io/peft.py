"""LoRA adapters in PEFT's layout: ``adapter_model.safetensors`` + ``adapter_config.json``, loadable with
``peft.PeftModel.from_pretrained(transformers_model, directory)`` on the base written by ``save_pretrained``.

qwix keeps ``A: [prod(in), r]`` and ``B: [r, prod(out)]``; PEFT's ``nn.Linear`` adapters are ``lora_A.weight:
[r, in]`` and ``lora_B.weight: [out, r]`` with the same scale ``lora_alpha / r``, so each is a transpose; the input and
output features are flattened in the order Hugging Face's weight uses (``(heads, head_dim)``). Query / key adapters of
a model in the interleaved RoPE layout (a GGUF) get the base's permutation of their output features, as the base
does when written. Projections that Hugging Face fuses (GPT-2's ``c_attn``) have no PEFT counterpart of the same
rank: refused, naming them. Parameters trained in full beside the adapters (``lora.train_fully``) are written
whole under their Hugging Face names, listed as ``modules_to_save`` (PEFT's layout for them).
"""

from __future__ import annotations

import json
import pathlib
from typing import Sequence

import numpy as np
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families import family_of
from flaxzoo.models.io.files import PathLike
from flaxzoo.models.io.pretrained import check_saveable, interleaved_to_half
from flaxzoo.models.layers.layer_layout import unstack_layer_values
from flaxzoo.models.adapters.lora import adapter_tensors, in_train_fully, lora_config_of

ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"
# PEFT's task type of each flaxzoo ``task`` (a model class's ``task`` attribute).
PEFT_TASKS = {"causal_lm": "CAUSAL_LM", "sequence_classification": "SEQ_CLS", "token_classification": "TOKEN_CLS"}


def _keys(path: str) -> tuple:
    return tuple(int(k) if k.isdigit() else k for k in path.split("."))


def save_adapters(model: nnx.Module, path: PathLike, *, base_model: str = "",
                  train_fully: Sequence[str] = ()) -> pathlib.Path:
    """Write the LoRA adapters of ``model`` (``apply_lora``'s, e.g. ``flaxzoo.models.io.load_adapted(WORKDIR)``) to
    the directory ``path`` in PEFT's layout; ``base_model`` is recorded as ``base_model_name_or_path``.
    ``train_fully``: the run's ``lora.train_fully`` patterns; the Hugging Face tensors of those modules are written
    whole, as PEFT's ``modules_to_save``. Returns the directory."""
    from safetensors.numpy import save_file

    lora = lora_config_of(model)
    adapters = adapter_tensors(model)
    if lora is None or not adapters:
        raise ValueError(f"save_adapters expects a model with LoRA adapters (flaxzoo.models.adapters.lora.apply_lora); this "
                         f"{type(model).__name__} has none")
    config: TransformerConfig = model.config
    family = family_of(config.model_type)
    check_saveable(config, family)
    cls = type(model)
    base = "" if cls is family.base_class else family.base_prefix + "."
    values: dict[tuple, np.ndarray] = {}
    for name, (dense, a, b) in adapters.items():
        keys = _keys(name)
        # B reshaped like the kernel's output part, so the per-layer split and the RoPE permutation apply to it.
        values[(*keys, "kernel", "a")] = np.asarray(a, np.float32)
        values[(*keys, "kernel")] = np.asarray(b, np.float32).reshape(*b.shape[:-1], *dense.out_shape)
    values = unstack_layer_values(values, config.layer_counts)
    if config.position == "rope" and config.rope_layout == "interleaved":
        interleaved_to_half(values, config)
        config = config.replace(rope_layout="half")
    kernels = [p[:-1] for p in values if p[-1] == "kernel" and (*p, "a") in values]
    weights = family.weights(config, cls, base).for_params({p + ("kernel",): () for p in kernels})
    hf_name = {e.paths[0][:-1]: e.hf for e in weights.entries if len(e.paths) == 1 and e.paths[0][-1] == "kernel"}
    fused = sorted(".".join(map(str, p)) for p in kernels if p not in hf_name)
    if fused:
        raise ValueError(f"Hugging Face's {family.model_type} fuses these projections with others, so PEFT has no "
                         f"adapter of rank {lora.rank} for them: {', '.join(fused[:4])}"
                         f"{' ...' if len(fused) > 4 else ''}; export the merged model instead (--to hf without "
                         "--adapters-only)")
    tensors, modules, saved = {}, [], []
    if train_fully:
        full = {p: np.asarray(v.get_value(), np.float32)
                for p, v in nnx.to_flat_state(nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))))}
        full = unstack_layer_values(full, config.layer_counts)
        if model.config.position == "rope" and model.config.rope_layout == "interleaved":
            interleaved_to_half(full, model.config)
        wanted = {p for p in full if in_train_fully(p, train_fully)}
        table = family.weights(config, cls, base).for_params(full)
        for e in table.entries:
            if all(p in wanted for p in e.paths):
                tensors[f"base_model.model.{e.hf}"] = np.ascontiguousarray(
                    e.transform.to_hf(*(full[p] for p in e.paths)))
                saved.append(e.hf.rsplit(".", 1)[0])
    for p in sorted(kernels, key=str):
        module = hf_name[p].removesuffix(".weight")
        a = values[(*p, "kernel", "a")]
        b = values[(*p, "kernel")].reshape(lora.rank, -1)
        tensors[f"base_model.model.{module}.lora_A.weight"] = np.ascontiguousarray(a.T)
        tensors[f"base_model.model.{module}.lora_B.weight"] = np.ascontiguousarray(b.T)
        modules.append(module)
    directory = pathlib.Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    adapter_config = {
        "peft_type": "LORA", "task_type": PEFT_TASKS.get(cls.task, "FEATURE_EXTRACTION"), "r": int(lora.rank),
        "lora_alpha": float(lora.alpha), "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "target_modules": modules, "modules_to_save": sorted(set(saved)) or None, "base_model_name_or_path": base_model,
        "inference_mode": True, "init_lora_weights": True, "use_rslora": False, "use_dora": False,
    }
    (directory / ADAPTER_CONFIG).write_text(json.dumps(adapter_config, indent=2) + "\n")
    return directory
