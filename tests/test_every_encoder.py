"""Every registered encoder family works with LoRA, int8 and the sharding rules, in every class it registers.

The encoder counterpart of ``tests/test_every_family.py`` (whose sharding helpers it reuses). The families are read
from ``flaxzoo.models.families.FAMILIES`` (``causal=False``) when the tests are collected, so a family registered
later is tested without a change here. Each gets a tiny config from transformers' own config class for its
``model_type`` (``AutoConfig.for_model`` with small sizes, through the family's ``config_from_hf``; the family's
folder says in ``parity_cases.SMALL_CONFIGS`` what its config calls the sizes (DistilBERT's ``dim`` / ``n_layers``)
and which settings switch its mechanisms on; a family whose config does not come out tiny fails, naming what to
add), and every class (base, masked LM, sequence /
token classification, question answering, ELECTRA's replaced-token detection) is checked, per layer (and the base
class stacked, ``scan_layers=True``, too), for:

* LoRA (``models/adapters/lora.py``): ``attention`` + ``mlp`` adapt exactly the projections int8 quantises, a fresh adapter
  leaves every output array bit for bit, and adapter values move them;
* int8 (``models/adapters/quantize.py``): every projection holds int8, and every output array stays close to float32's
  (cosine >= 0.999 as ``tests/test_quantize.py``'s embeddings; the heads' probabilities within 0.02 as its
  classifier);
* the sharding rules (``train/sharding.py``): every parameter, per layer and stacked, plain and LoRA-adapted, carries
  logical axes whose rules give a ``PartitionSpec`` on a (2, 2, 2) mesh, the family's mechanism parameters included
  (ALBERT's shared block, the factorised embeddings' projection, DeBERTa's relative table and projections).

Outputs are arrays or named tuples (``EncoderOutput``, ``SpanLogits``): every array field is compared.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.families import FAMILIES
from flaxzoo.models.adapters.lora import LoraConfig, apply_lora, dense_modules
from flaxzoo.models.adapters.quantize import is_quantized, module_at, projection_paths, quantize_model
from tests.encoder_cases import SMALL_CONFIGS, hf_config_kwargs
from tests.test_every_family import LORA, abstract, check_specs

ENCODERS = sorted(name for name, family in FAMILIES.items() if not family.causal)
# (model_type, class, scan_layers): every class per layer, and each family's base class stacked.
CASES = [(name, cls, False) for name in ENCODERS for cls in FAMILIES[name].classes] + [
    (name, FAMILIES[name].base_class, True) for name in ENCODERS]
SMALL = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
             max_position_embeddings=64, pad_token_id=0, num_labels=3, initializer_range=0.1)
# Heads whose output is scores: their probabilities (softmax over the last axis; sigmoid for per-token binary
# scores) are compared too.
SIGMOID_TASKS = ("replaced_token_detection",)
IDS = jnp.asarray(np.random.RandomState(0).randint(3, SMALL["vocab_size"], (2, 8)), jnp.int32)
MASK = jnp.asarray([[1] * 8, [1] * 5 + [0] * 3], jnp.int32)  # the second row right-padded


def tiny_config(model_type: str) -> TransformerConfig:
    """The family's config from a tiny transformers config of ``model_type`` (SMALL under the family's names, plus
    its settings: ``tests/encoder_cases.py``); fails naming the family when the config does not come out with SMALL's sizes."""
    kwargs = hf_config_kwargs(model_type, SMALL)
    try:
        hf = transformers.AutoConfig.for_model(model_type, **kwargs).to_dict()
    except ValueError as exc:
        pytest.fail(f"{model_type}: transformers has no config of that name ({exc})")
    config = FAMILIES[model_type].config_from_hf(hf)
    got = dict(vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
               num_attention_heads=config.num_heads, intermediate_size=config.intermediate_size)
    wrong = {key: value for key, value in got.items() if value != SMALL[key]}
    if wrong:
        pytest.fail(f"{model_type}: the tiny config came out with {wrong}, not {SMALL}: add the names its "
                    "transformers config gives these sizes to the folder's parity_cases.SMALL_CONFIGS 'sizes'")
    return config


def arrays(output: Any) -> dict[str, np.ndarray]:
    """``{field name: array}`` of a model output: an array (``"output"``) or a named tuple (its non-None fields;
    a tuple of arrays, such as per-layer attention weights, one entry each)."""
    if not isinstance(output, tuple):
        return {"output": np.asarray(output)}
    out = {}
    for name, value in output._asdict().items():
        if isinstance(value, (tuple, list)):
            out.update({f"{name}.{i}": np.asarray(v) for i, v in enumerate(value)})
        elif value is not None:
            out[name] = np.asarray(value)
    return out


def perturbed(model: nnx.Module) -> nnx.Module:
    """``model`` with its biases and norm scales moved off their initial 0 and 1 (in place), as trained weights
    are, so that no check passes because a term is zero."""
    params = nnx.state(model, nnx.Param)
    flat = nnx.to_flat_state(params)
    keys = jax.random.split(jax.random.key(2), len(flat))
    for key, (path, variable) in zip(keys, flat):
        if str(path[-1]) in ("bias", "scale"):
            value = variable.get_value()
            variable.set_value(value + 0.1 * jax.random.normal(key, value.shape, value.dtype))
    nnx.update(model, nnx.from_flat_state(flat))
    return model


def run(model: nnx.Module) -> dict[str, np.ndarray]:
    """The model's output arrays on the padded batch. Eager: the tiny models run faster op by op than compiled,
    each (family, class, float / LoRA / int8) once."""
    return arrays(model(IDS, MASK))


@pytest.fixture(scope="module")
def built() -> Callable[[str, type, bool], tuple[nnx.Module, dict[str, np.ndarray]]]:
    """``get(model_type, cls, scan)`` → (the class, perturbed, in eval mode, its layers stacked with ``scan``; its
    float32 output arrays), once each."""
    cache: dict[tuple[str, type, bool], tuple[nnx.Module, dict[str, np.ndarray]]] = {}
    configs: dict[str, TransformerConfig] = {}

    def get(model_type: str, cls: type, scan: bool):
        if (model_type, cls, scan) not in cache:
            if model_type not in configs:
                configs[model_type] = tiny_config(model_type)
            model = perturbed(cls(configs[model_type].replace(scan_layers=scan), rngs=nnx.Rngs(0)))
            model.eval()
            outputs = run(model)
            assert outputs and all(np.isfinite(x).all() for x in outputs.values()), (model_type, cls.__name__)
            cache[model_type, cls, scan] = model, outputs
        return cache[model_type, cls, scan]

    return get


def blocks(config: TransformerConfig) -> int:
    """How many projection modules of each kind the model holds: one a layer, or one for all of them (a block shared
    by every layer, as ALBERT's; stacked layers, each projection one ``Dense`` with a leading layer axis)."""
    return 1 if config.shared_layers or config.scan_layers else config.num_layers


def case_id(case: tuple[str, type, bool]) -> str:
    return f"{case[0]}-{case[1].__name__}" + ("-stacked" if case[2] else "")


def tiered_cases() -> list:
    """CASES as pytest params: each family's base class per layer in the quick tier, the heads and the stacked
    layout ``slow`` (the heads add a Dense after the backbone the base class exercises; the layouts' equality:
    the family files' ``test_scanned_layout_equals_the_unrolled_one``)."""
    return [pytest.param(*case, id=case_id(case),
                         marks=() if case[1] is FAMILIES[case[0]].base_class and not case[2] else pytest.mark.slow)
            for case in CASES]


@pytest.mark.parametrize("model_type,cls,scan", tiered_cases())
def test_lora_adapts_the_projections_and_starts_at_the_base_model(built, model_type, cls, scan):
    base, outputs = built(model_type, cls, scan)
    model = apply_lora(nnx.clone(base), LORA, seed=0)
    adapted = sorted(path for path, dense in dense_modules(model).items() if hasattr(dense, "kernel_lora_a"))
    projections = sorted(".".join(map(str, path)) for path in projection_paths(base))
    assert adapted == projections, "LoRA's attention + mlp targets and the int8 projections differ"
    assert len(adapted) >= 6 * blocks(base.config)  # q, k, v, out and two or three MLP projections a block
    fresh = run(model)
    assert fresh.keys() == outputs.keys()
    for name in outputs:  # B = 0 adds exactly zero; the adapted program may fuse the rest in another order (ulps)
        np.testing.assert_allclose(fresh[name], outputs[name], rtol=0, atol=2e-6, err_msg=name)

    state = nnx.state(model, nnx.LoRAParam)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    nnx.update(model, jax.tree.unflatten(tree, [0.05 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]))
    moved = run(model)
    for name in outputs:
        scale = max(np.abs(outputs[name]).max(), 1e-6)
        assert np.abs(moved[name] - outputs[name]).max() > 1e-3 * scale, f"the adapters do not reach {name}"


def probabilities(x: np.ndarray, task: str) -> np.ndarray:
    return np.asarray(jax.nn.sigmoid(x) if task in SIGMOID_TASKS else jax.nn.softmax(x, axis=-1))


@pytest.mark.parametrize("model_type,cls,scan", tiered_cases())
def test_int8_quantises_the_projections_and_keeps_the_outputs(built, model_type, cls, scan):
    base, outputs = built(model_type, cls, scan)
    model = quantize_model(nnx.clone(base))
    paths = projection_paths(model)
    assert len(paths) >= 6 * blocks(base.config) and all(is_quantized(module_at(model, p)) for p in paths)
    assert not any(is_quantized(module_at(base, p)) for p in projection_paths(base))  # the float model untouched
    quantized = run(model)
    assert quantized.keys() == outputs.keys()
    report = []
    for name in outputs:
        ours, theirs = quantized[name].astype(np.float64), outputs[name].astype(np.float64)
        cosine = (ours.ravel() @ theirs.ravel()) / (np.linalg.norm(ours) * np.linalg.norm(theirs))
        line = f"{name} cosine {cosine:.7f}"
        assert cosine >= 0.999, f"{name}: cosine {cosine}"
        assert not np.array_equal(ours, theirs), f"{name}: the int8 projections do not reach it"
        if cls.task != "base":  # the heads' scores: their probabilities too
            probs = [probabilities(x, cls.task) for x in (ours, theirs)]
            line += f", max |probability difference| {np.abs(probs[0] - probs[1]).max():.2e}"
            np.testing.assert_allclose(probs[0], probs[1], atol=0.02, err_msg=name)
        report.append(line)
    print(f"\n  {model_type} {cls.__name__}{' stacked' if scan else ''} int8: " + "; ".join(report))


@pytest.mark.parametrize("model_type", ENCODERS)
def test_every_parameter_has_a_sharding_spec(model_type):
    family, config = FAMILIES[model_type], tiny_config(model_type)
    for scan in (False, True):
        for cls in family.classes:
            plain = abstract(cls, config.replace(scan_layers=scan))
            specs = check_specs(plain)
            for name in SMALL_CONFIGS[model_type]["mechanisms"]:
                assert any(path.endswith(name) for path in specs), (model_type, cls.__name__, scan, name)
            heads = any(not path.startswith("backbone.") for path in dense_modules(plain))
            targets = ("attention", "mlp", "head") if heads else ("attention", "mlp")
            lora = check_specs(abstract(cls, config.replace(scan_layers=scan),
                                        LoraConfig(rank=4, alpha=8.0, targets=targets)))
            adapted = {path for path in lora if "lora" in path}
            assert adapted and set(lora) - adapted == set(specs), (model_type, cls.__name__, scan)
            if heads:
                assert any(not path.startswith("backbone.") for path in adapted), "the head is not adapted"
