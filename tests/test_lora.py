"""LoRA (models/adapters/lora.py, computed by qwix): the adapted projections against numpy's x·W + (x·A)·B·alpha/r, only the
named targets adapted, the base untouched by training, per-layer = stacked layers, merging, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from flaxzoo.models import BertForSequenceClassification, generate, get_preset
from flaxzoo.models.adapters.lora import (LoraConfig, LoraError, apply_lora, dense_modules, has_lora, lora_param_count, merge_lora,
                         target_paths)
from flaxzoo.models.modeling import create_model

IDS = np.random.RandomState(0).randint(0, 1000, (2, 10)).astype(np.int32)


def adapted(preset="llama-tiny", scan=False, seed=0, cls=None, **lora):
    config = get_preset(preset).replace(scan_layers=scan)
    settings = {"rank": 4, "alpha": 8.0, **lora}
    return apply_lora(create_model(config, cls, seed=seed), LoraConfig(**settings), seed=seed)


def randomise_adapters(model, seed=1):
    """B starts at zero (the adapted model equals its base): give every adapter tensor random values."""
    state = nnx.state(model, nnx.LoRAParam)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    nnx.update(model, jax.tree.unflatten(tree, [0.05 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]))
    return model


def test_the_adapted_projection_is_x_w_plus_x_a_b_times_alpha_over_rank():
    model = randomise_adapters(adapted(rank=3, alpha=12.0, targets=("query", "down")))
    for path, dense in dense_modules(model).items():
        x = np.random.RandomState(1).randn(2, 5, *dense.in_shape).astype(np.float32)
        w = np.asarray(dense.kernel.get_value(), np.float64)
        n_in = len(dense.in_shape)
        expected = np.tensordot(x.astype(np.float64), w, axes=n_in)
        if path.endswith(("query", "down")):
            a = np.asarray(dense.kernel_lora_a.get_value(), np.float64)
            b = np.asarray(dense.kernel_lora_b.get_value(), np.float64)
            assert a.shape == (np.prod(dense.in_shape), 3) and b.shape == (3, np.prod(dense.out_shape))
            flat = x.reshape(2, 5, -1).astype(np.float64)
            expected = expected + ((flat @ a @ b) * (12.0 / 3)).reshape(expected.shape)
        else:
            assert not hasattr(dense, "kernel_lora_a"), path
        np.testing.assert_allclose(np.asarray(dense(jnp.asarray(x))), expected, rtol=1e-5, atol=1e-5, err_msg=path)


def test_only_the_named_targets_get_adapters_and_counts():
    model = adapted(targets=("attention",))
    config = get_preset("llama-tiny")
    chosen = target_paths(model, ("attention",))
    assert len(chosen) == 4 * config.num_layers and all(".attention." in p for p in chosen)
    with_adapters = sorted(p for p, d in dense_modules(model).items() if hasattr(d, "kernel_lora_a"))
    assert with_adapters == chosen
    d, kv, hd = config.hidden_size, config.num_kv_heads, config.hidden_size // config.num_heads
    per_layer = 4 * (d + d) + 4 * (d + kv * hd) * 2 + 4 * (d + d)  # query, key, value, out: r·(in + out) each
    assert lora_param_count(model) == config.num_layers * per_layer
    mlp = adapted(targets=("mlp",))
    assert all(".mlp." in p for p, d in dense_modules(mlp).items() if hasattr(d, "kernel_lora_a"))
    # A regular expression over module paths: layer 1's value projection only.
    one = adapted(targets=(r"layers\.1\.attention\.value$",))
    assert [p for p, d in dense_modules(one).items() if hasattr(d, "kernel_lora_a")] == \
        ["backbone.layers.1.attention.value"]


def test_a_fresh_adapter_leaves_the_output_unchanged_and_training_moves_only_the_adapters():
    base = create_model(get_preset("llama-tiny"))
    model = adapted()
    np.testing.assert_array_equal(np.asarray(model(IDS)), np.asarray(base(IDS)))
    graphdef, lora_params, rest = nnx.split(model, nnx.LoRAParam, ...)
    frozen_before = jax.tree.map(np.asarray, nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))))
    tx = optax.adam(1e-2)
    opt_state = tx.init(lora_params)

    def loss(params):
        logits = nnx.merge(graphdef, params, rest)(IDS[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, IDS[:, 1:]).mean()

    losses = []
    loss_and_grads = jax.jit(jax.value_and_grad(loss))  # compiled once: five eager passes cost seconds
    for _ in range(5):
        value, grads = loss_and_grads(lora_params)
        updates, opt_state = tx.update(grads, opt_state, lora_params)
        lora_params = optax.apply_updates(lora_params, updates)
        losses.append(float(value))
    assert losses[-1] < losses[0] - 0.05, losses
    trained = nnx.merge(graphdef, lora_params, rest)
    frozen_after = jax.tree.map(np.asarray, nnx.state(trained, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))))
    for before, after in zip(jax.tree.leaves(frozen_before), jax.tree.leaves(frozen_after)):
        np.testing.assert_array_equal(before, after)  # the base, bit for bit
    assert not np.allclose(np.asarray(trained(IDS)), np.asarray(base(IDS)), atol=1e-3)


@pytest.mark.slow_variants
@pytest.mark.parametrize("preset", ["llama-tiny", "gpt2-tiny"])
def test_stacked_layers_hold_the_same_adapters_as_per_layer(preset):
    fresh = adapted(preset, scan=False)
    stacked = adapted(preset, scan=True)
    layers = get_preset(preset).num_layers
    # Same seed: the same initial A in both layouts (stacked: [layers, in, r]).
    for path, dense in dense_modules(stacked).items():
        if hasattr(dense, "kernel_lora_a"):
            for i in range(layers):
                one = dense_modules(fresh)[path.replace("layers.", f"layers.{i}.")]
                np.testing.assert_array_equal(np.asarray(dense.kernel_lora_a.get_value()[i]),
                                              np.asarray(one.kernel_lora_a.get_value()))
    per_layer = randomise_adapters(fresh)
    # The same adapter values in both layouts give the same logits.
    values = {}
    for path, dense in dense_modules(per_layer).items():
        if hasattr(dense, "kernel_lora_a"):
            values[path] = (dense.kernel_lora_a.get_value(), dense.kernel_lora_b.get_value())
    for path, dense in dense_modules(stacked).items():
        if hasattr(dense, "kernel_lora_a"):
            parts = [values[path.replace("layers.", f"layers.{i}.")] for i in range(layers)]
            dense.kernel_lora_a.set_value(jnp.stack([a for a, _ in parts]))
            dense.kernel_lora_b.set_value(jnp.stack([b for _, b in parts]))
    np.testing.assert_allclose(np.asarray(stacked(IDS)), np.asarray(per_layer(IDS)), atol=1e-5)


@pytest.mark.slow_variants
@pytest.mark.parametrize("scan", [False, True])
def test_merged_model_is_plain_and_equals_the_adapted_one(scan):
    model = randomise_adapters(adapted(scan=scan, targets=("attention", "mlp")))
    merged = merge_lora(model)
    assert not has_lora(merged) and type(merged).__name__ == "GPTForCausalLM"
    assert not any(hasattr(d, "kernel_lora_a") for d in dense_modules(merged).values())
    np.testing.assert_allclose(np.asarray(merged(IDS)), np.asarray(model(IDS)), atol=1e-5)
    # Cached decoding (another model method than __call__) runs the adapters too.
    np.testing.assert_array_equal(np.asarray(generate(model, IDS[:, :4], 6)), np.asarray(generate(merged, IDS[:, :4], 6)))


def test_lora_on_a_classifier_with_the_head_as_a_target():
    model = randomise_adapters(adapted("bert-tiny", cls=BertForSequenceClassification, targets=("attention", "head")))
    adapted_paths = sorted(p for p, d in dense_modules(model).items() if hasattr(d, "kernel_lora_a"))
    assert "classifier" in adapted_paths and "pooler" in adapted_paths
    merged = merge_lora(model)
    np.testing.assert_allclose(np.asarray(merged(IDS)), np.asarray(model(IDS)), atol=1e-5)


@pytest.mark.parametrize("settings, field, words", [
    ({"rank": 0}, "rank", "rank=0: expected an integer > 0"),
    ({"rank": -2}, "rank", "rank=-2"),
    ({"rank": 2.5}, "rank", "rank=2.5"),
    ({"alpha": 0}, "alpha", "alpha=0"),
    ({"alpha": float("nan")}, "alpha", "alpha=nan"),
    ({"targets": ()}, "targets", "non-empty"),
    ({"targets": "attention"}, "targets", "tuple"),
    ({"targets": ("attention[",)}, "targets", "valid regular expression"),
    ({"base_dtype": "int4"}, "base_dtype", "base_dtype='int4'"),
])
def test_bad_lora_settings_are_one_clear_error(settings, field, words):
    with pytest.raises(LoraError, match=words.replace("[", r"\[").replace("(", r"\(")) as info:
        LoraConfig(**{"rank": 4, "alpha": 8.0, **settings})
    assert info.value.field == field


def test_a_target_matching_nothing_lists_the_module_paths():
    model = create_model(get_preset("gpt2-tiny"))
    with pytest.raises(LoraError, match="'gate' matches no projection") as info:
        apply_lora(model, LoraConfig(rank=2, alpha=4.0, targets=("attention", "gate")))
    assert "backbone.layers.0.mlp.up" in str(info.value)  # what it could have matched
    assert not has_lora(model)  # nothing was changed
    with pytest.raises(LoraError, match="already has LoRA adapters"):
        apply_lora(adapted(), LoraConfig(rank=2, alpha=4.0))


@pytest.mark.slow_variants
@pytest.mark.parametrize("preset, rope_layout", [("llama-tiny", "half"), ("llama-tiny", "interleaved"),
                                                 ("bert-tiny", None)])
def test_adapters_in_peft_layout_load_with_peft_onto_the_base_to_the_same_logits(preset, rope_layout, tmp_path):
    """Our adapted model = transformers' base + peft's adapters from our files (≤ 1e-4, float32)."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    import transformers

    from flaxzoo.models import save_pretrained
    from flaxzoo.models.io.peft import save_adapters

    config = get_preset(preset)
    if rope_layout:
        config = config.replace(rope_layout=rope_layout)
    base_dir = save_pretrained(create_model(config, seed=3), tmp_path / "base")
    # The flaxzoo side: the saved base loaded back in the layout it had, adapted, adapters randomised.
    model = create_model(config, seed=3)
    model = randomise_adapters(apply_lora(model, LoraConfig(rank=4, alpha=8.0, targets=("attention", "mlp"))), seed=5)
    adapters = save_adapters(model, tmp_path / "adapters", base_model=str(base_dir))
    names = set(__import__("safetensors.numpy", fromlist=["x"]).load_file(str(adapters / "adapter_model.safetensors")))
    assert any(n.endswith("lora_A.weight") for n in names) and any(n.endswith("lora_B.weight") for n in names)
    auto = transformers.AutoModelForCausalLM if config.causal else transformers.AutoModelForMaskedLM
    hf = auto.from_pretrained(base_dir).eval()
    hf = peft.PeftModel.from_pretrained(hf, adapters).eval()
    ids = IDS[:, :8]
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(ids, dtype=torch.long))
    np.testing.assert_allclose(np.asarray(model(ids)), out.logits.numpy(), atol=1e-4)


@pytest.mark.slow_variants
@pytest.mark.parametrize("scan, base_dtype", [(False, "int8"), (True, "int8"), (False, "bfloat16")])
def test_frozen_base_in_int8_or_bfloat16(scan, base_dtype):
    """QLoRA-style: the adapted projections' kernels int8 (qwix, per-channel scales) or bfloat16, adapters float32;
    outputs near the float base, gradients reach the adapters, merging dequantises."""
    config = get_preset("llama-tiny").replace(scan_layers=scan)
    base = create_model(config)
    reference = np.asarray(base(IDS))
    for tolerance in (0.05,):
        model = apply_lora(create_model(config), LoraConfig(rank=4, alpha=8.0, base_dtype=base_dtype))
        kernels = {str(v.get_value().dtype) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))
                   if ".attention." in ".".join(map(str, p)) and "lora" not in str(p[-1]) and "scale" not in p}
        assert kernels == {"int8" if base_dtype == "int8" else "bfloat16"}, (base_dtype, kernels)
        adapters = {str(v.get_value().dtype) for _, v in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))}
        assert adapters == {"float32"}
        out = np.asarray(model(IDS))
        assert 0 < np.abs(out - reference).max() < tolerance, base_dtype
        graphdef, params, rest = nnx.split(randomise_adapters(model), nnx.LoRAParam, ...)
        grads = jax.jit(jax.grad(lambda p: nnx.merge(graphdef, p, rest)(IDS).sum()))(params)
        assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads)), base_dtype
        model = nnx.merge(graphdef, params, rest)
        np.testing.assert_allclose(np.asarray(merge_lora(model)(IDS)), np.asarray(model(IDS)), atol=2e-5)


def test_train_fully_names_select_the_head_or_the_embeddings():
    from flaxzoo.models import BertForMaskedLM
    from flaxzoo.models.adapters.lora import frozen_and_trainable, in_train_fully

    def modules(model, names):
        return sorted({".".join(map(str, p[:-1])) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))
                       if in_train_fully(p, names)})

    mlm = create_model(get_preset("bert-tiny"), BertForMaskedLM)
    assert modules(mlm, ("head",)) == ["decoder", "transform", "transform_norm"]
    clf = create_model(get_preset("bert-tiny"), BertForSequenceClassification)
    assert modules(clf, ("head",)) == ["classifier", "pooler"]
    from flaxzoo.models import Seq2SeqForConditionalGeneration

    t5 = create_model(get_preset("t5-tiny"), Seq2SeqForConditionalGeneration)  # untied: its own LM head
    assert modules(t5, ("head",)) == ["lm_head"]
    gpt = create_model(get_preset("gpt2-tiny"))
    assert modules(gpt, ("embeddings",)) == ["backbone.embeddings.positions",
                                             "backbone.embeddings.tokens"]
    adapted_clf = apply_lora(clf, LoraConfig(rank=2, alpha=2.0))
    trained = nnx.state(adapted_clf, frozen_and_trainable(("head",)))
    names = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(trained)}
    assert {"classifier.kernel", "classifier.bias", "pooler.kernel"} <= names
    assert all("lora" in n or n.startswith(("classifier", "pooler")) for n in names)


@pytest.mark.slow_variants
@pytest.mark.parametrize("scan", [False, True])
def test_bfloat16_base_casts_only_the_adapted_projections(scan):
    """``base_dtype="bfloat16"``: the adapted projections' kernels and biases bfloat16; the head trained fully
    (pooler, classifier), the projections not targeted, the embeddings and norms stay float32, and so do the Adam
    moments of what is trained."""
    from flaxzoo.models.adapters.lora import frozen_and_trainable

    config = get_preset("bert-tiny").replace(scan_layers=scan)
    model = apply_lora(create_model(config.replace(num_labels=3), BertForSequenceClassification),
                       LoraConfig(rank=2, alpha=4.0, targets=("query", "value"), base_dtype="bfloat16"))
    dtypes = {".".join(map(str, p)): str(v.get_value().dtype)
              for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    adapted_weights = {p for p in dtypes if ".attention.query." in p or ".attention.value." in p}
    assert adapted_weights and {p.rsplit(".", 1)[-1] for p in adapted_weights} >= {"kernel", "bias"}
    for path, dtype in dtypes.items():
        expected = "float32" if "lora" in path or path not in adapted_weights else "bfloat16"
        assert dtype == expected, (path, dtype)
    for path in ("classifier.kernel", "classifier.bias", "pooler.kernel", "pooler.bias"):
        assert dtypes[path] == "float32", path
    trained = nnx.state(model, frozen_and_trainable(("head",)))
    moments = optax.adam(1e-3).init(trained)
    assert {str(x.dtype) for x in jax.tree.leaves(moments) if x.ndim} == {"float32"}
