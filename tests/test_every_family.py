"""Every registered generating family (decoders, encoder-decoders) works with LoRA, int8 and the sharding rules.

The families are read from ``flaxzoo.models.families.FAMILIES`` when the tests are collected, so a family registered
later is tested without a change here. Each gets a tiny config from transformers' own config class for its
``model_type`` (``AutoConfig.for_model`` with small sizes, through the family's ``config_from_hf``; a family
transformers lacks: its ``*-tiny`` preset), and is checked for:

* LoRA (``models/adapters/lora.py``): ``attention`` + ``mlp`` adapt exactly the projections int8 quantises, a fresh adapter
  leaves the logits bit for bit, and adapter values move them (they are wired into the family's block);
* int8 (``models/adapters/quantize.py``): every projection holds int8, and the logits stay close to float32's (the tolerances
  of ``tests/test_quantize.py``: cosine >= 0.999 as its embeddings, probabilities within 0.02 as its classifier);
* the sharding rules (``train/sharding.py``): every parameter of every class, per layer and stacked, plain and
  LoRA-adapted, carries logical axes whose rules give a ``PartitionSpec`` on a (2, 2, 2) mesh, the mechanism
  parameters included (QK-norms, sandwich norms, the classifier's score).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx
from jax.sharding import PartitionSpec as P

from flaxzoo.models import GPTForSequenceClassification
from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families import PRESETS, get_preset
from flaxzoo.models.families import FAMILIES
from flaxzoo.models.adapters.lora import LoraConfig, apply_lora, dense_modules
from flaxzoo.models.adapters.quantize import is_quantized, module_at, projection_paths, quantize_model
from flaxzoo.train.sharding import MESH_AXES, logical_to_mesh, param_shardings

DECODERS = sorted(name for name, family in FAMILIES.items() if family.causal)
SMALL = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, head_dim=16, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
             pad_token_id=0)
# Sizes transformers' BART-layout configs hold per stack, which SMALL's names do not reach (no attribute_map)
PER_STACK = dict(decoder_layers=2, decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96)
IDS = jnp.asarray(np.random.RandomState(0).randint(3, SMALL["vocab_size"], (2, 8)), jnp.int32)
MESH = jax.sharding.AbstractMesh((2, 2, 2), MESH_AXES)
LORA = LoraConfig(rank=4, alpha=8.0, targets=("attention", "mlp"))


def tiny_config(model_type: str) -> TransformerConfig:
    """The family's config from a tiny transformers config of ``model_type`` (its ``*-tiny`` preset when
    transformers has no such config)."""
    family = FAMILIES[model_type]
    try:
        hf = transformers.AutoConfig.for_model(model_type, **SMALL).to_dict()
        hf.update({name: size for name, size in PER_STACK.items() if name in hf})
    except ValueError:
        tiny = [config for name, config in PRESETS.items() if config.model_type == model_type and "tiny" in name]
        if not tiny:
            pytest.fail(f"{model_type}: transformers has no config of that name and flaxzoo no '*-tiny' preset")
        return tiny[0]
    return family.config_from_hf(hf)


def generating_class(family) -> type:
    """The family's language model: a causal LM, or an encoder-decoder's conditional generator."""
    return family.class_for("causal_lm") or family.class_for("seq2seq_lm")


@nnx.jit
def forward(model: nnx.Module, ids: jax.Array) -> jax.Array:
    """Logits of ``ids`` (an encoder-decoder reads them as its source and its target)."""
    return model(ids, None, ids) if model.config.is_encoder_decoder else model(ids)


@pytest.fixture(scope="module")
def built() -> Callable[[str], tuple[Any, nnx.Module, np.ndarray]]:
    """``get(model_type)`` → (family, its language model in eval mode, its float32 logits ``[2, 8, vocab]``), once
    each."""
    cache: dict[str, tuple[Any, nnx.Module, np.ndarray]] = {}

    def get(model_type: str):
        if model_type not in cache:
            family = FAMILIES[model_type]
            model = generating_class(family)(tiny_config(model_type), rngs=nnx.Rngs(0))
            model.eval()
            cache[model_type] = family, model, np.asarray(forward(model, IDS))
        return cache[model_type]

    return get


@pytest.mark.parametrize("model_type", DECODERS)
def test_lora_adapts_the_projections_and_starts_at_the_base_model(built, model_type):
    _, base, logits = built(model_type)
    model = apply_lora(nnx.clone(base), LORA, seed=0)
    adapted = sorted(path for path, dense in dense_modules(model).items() if hasattr(dense, "kernel_lora_a"))
    projections = sorted(".".join(map(str, path)) for path in projection_paths(base))
    assert adapted == projections, "LoRA's attention + mlp targets and the int8 projections differ"
    assert len(adapted) >= 6 * base.config.num_layers  # q, k, v, out and two or three MLP projections a layer
    np.testing.assert_array_equal(np.asarray(forward(model, IDS)), logits)

    state = nnx.state(model, nnx.LoRAParam)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    nnx.update(model, jax.tree.unflatten(tree, [0.05 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]))
    assert np.abs(np.asarray(forward(model, IDS)) - logits).max() > 1e-4, "the adapters do not reach the logits"


@pytest.mark.parametrize("model_type", DECODERS)
def test_int8_quantises_the_projections_and_keeps_the_logits(built, model_type):
    _, base, logits = built(model_type)
    model = quantize_model(nnx.clone(base))
    paths = projection_paths(model)
    assert len(paths) >= 6 * base.config.num_layers and all(is_quantized(module_at(model, p)) for p in paths)
    assert not any(is_quantized(module_at(base, p)) for p in projection_paths(base))  # the float model untouched
    ours = np.asarray(forward(model, IDS), np.float64)
    theirs = logits.astype(np.float64)
    cosine = (ours.ravel() @ theirs.ravel()) / (np.linalg.norm(ours) * np.linalg.norm(theirs))
    probs = [np.asarray(jax.nn.softmax(x, axis=-1)) for x in (ours, theirs)]
    print(f"\n  {model_type} int8: logit cosine {cosine:.6f}, max |logit difference| "
          f"{np.abs(ours - theirs).max():.2e} of max |logit| {np.abs(theirs).max():.2e}, max |probability "
          f"difference| {np.abs(probs[0] - probs[1]).max():.2e}")
    assert cosine >= 0.999
    np.testing.assert_allclose(probs[0], probs[1], atol=0.02)


def check_specs(model: nnx.Module) -> dict[str, P]:
    """``{dotted parameter path: mesh PartitionSpec}`` of an (abstract) model: every parameter carries logical axes,
    one per dimension, each with a rule; ``param_shardings`` (what the training program calls) takes them all."""
    params = nnx.state(model, nnx.Param)
    specs = {}
    for path, variable in nnx.to_flat_state(params):
        name, shape = ".".join(map(str, path)), variable.get_value().shape
        axes = variable.get_metadata().get("out_sharding")
        assert axes is not None and len(axes) == len(shape), f"{name} {shape}: logical axes {axes}"
        specs[name] = logical_to_mesh(tuple(axes), shape, MESH)
    shardings = param_shardings(nnx.to_pure_dict(nnx.get_partition_spec(params)), nnx.to_pure_dict(params), MESH)
    assert len(jax.tree.leaves(shardings)) == len(specs)
    return specs


def abstract(cls: type, config: TransformerConfig, lora: LoraConfig | None = None) -> nnx.Module:
    def build():
        model = cls(config, rngs=nnx.Rngs(0))
        return apply_lora(model, lora, seed=0) if lora is not None else model

    return nnx.eval_shape(build)


@pytest.mark.parametrize("model_type", DECODERS)
def test_every_parameter_has_a_sharding_spec(model_type):
    family, config = FAMILIES[model_type], tiny_config(model_type)
    for scan in (False, True):
        for cls in family.classes:
            specs = check_specs(abstract(cls, config.replace(scan_layers=scan)))
            if cls.task == "sequence_classification":
                assert specs["score.kernel"] == P("fsdp", None)
        classifier = family.class_for("sequence_classification")
        targets = ("attention", "mlp", "head") if classifier else ("attention", "mlp")
        lora = check_specs(abstract(classifier or generating_class(family), config.replace(scan_layers=scan),
                                    LoraConfig(rank=4, alpha=8.0, targets=targets)))
        assert any("lora" in name for name in lora)


@pytest.mark.parametrize("qk_norm", ["head", "full"])
def test_the_mechanism_parameters_have_sharding_specs(qk_norm):
    """QK-norms, sandwich norms and the decoder classifier's score, per layer and stacked, plain and LoRA-adapted."""
    config = get_preset("llama-tiny", qk_norm=qk_norm, norm_placement="sandwich", num_labels=3)
    wanted = ("attention.query_norm.scale", "attention.key_norm.scale", "attention_post_norm.scale",
              "mlp_post_norm.scale", "score.kernel")
    for scan in (False, True):
        for lora in (None, LoraConfig(rank=4, alpha=8.0, targets=("attention", "mlp", "head"))):
            specs = check_specs(abstract(GPTForSequenceClassification, config.replace(scan_layers=scan), lora))
            for name in wanted:
                assert any(path.endswith(name) for path in specs), (name, scan, lora)
