"""``--compare keras_hub``: KerasHub's GPT-2 decoding beside flaxzoo's ``gpt_generate`` (same sizes, same process,
Keras on JAX), and the ``--compare`` list's checks. No test asserts a time. The runs need keras-hub (the ``compare``
extra, not the ``test`` one): without it they skip; the argument checks need nothing."""

import pytest

from flaxzoo.train.tools import bench

TINY = ["--work", "gpt_generate", "--tiny", "--json", "--generate-repeats", "1", "--peak-size", "256"]


def gpt2_tied_params(vocab: int, positions: int, hidden: int, intermediate: int, layers: int) -> int:
    """GPT-2's parameters with the output projection tied to the token table: the token table (once) and the
    learned position table; per layer two layer norms (scale, bias), Q/K/V and the attention output with biases, the
    MLP's two projections with biases; the final layer norm."""
    d, f = hidden, intermediate
    per_layer = 2 * 2 * d + 3 * (d * d + d) + (d * d + d) + (d * f + f) + (f * d + d)
    return vocab * d + positions * d + layers * per_layer + 2 * d


def run_tiny(compare: str, monkeypatch, *extra: str) -> dict:
    monkeypatch.setenv("KERAS_BACKEND", "jax")  # read when keras is first imported; keras' own default is tensorflow
    pytest.importorskip("keras_hub")
    [result] = bench.main([*TINY, "--compare", compare, *extra])
    return result


def test_keras_hub_decodes_the_same_model_beside_flaxzoo(monkeypatch, capsys):
    """Two tiny rounds: KerasHub's side has its median round, the per-round ratios flaxzoo / KerasHub and their
    median; its model has the workload's sizes (the parameters of GPT-2 with tied embeddings, as flaxzoo's), decodes
    greedily and every new token (8 in ``--tiny``)."""
    result = run_tiny("keras_hub", monkeypatch, "--rounds", "2")
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(printed) == 1 and '"keras_hub_ratio"' in printed[0]
    assert "transformers" not in result and "ratio" not in result and "round_ratios" not in result
    theirs = result["keras_hub"]
    assert result["tokens_per_s"] > 0 and theirs["tokens_per_s"] > 0 and theirs["first_call_s"] > 0
    assert theirs["framework"].startswith("keras_hub ") and "jax backend" in theirs["framework"]
    assert theirs["sampler"] == "GreedySampler" and len(theirs["tokens"]) == 8
    assert len(result["keras_hub_round_ratios"]) == 2 and result["keras_hub_ratio"] > 0
    # Two rounds: the median of the ratios is their mean; each is rounded to 3 decimals in round_ratios.
    assert result["keras_hub_ratio"] == pytest.approx(sum(result["keras_hub_round_ratios"]) / 2, abs=2e-3)
    spec = bench.workload_spec("gpt_generate", bench.parse_args(TINY))
    config = spec["config"]
    expected = gpt2_tied_params(config.vocab_size, config.max_position_embeddings, config.hidden_size,
                                4 * config.hidden_size, config.num_layers)
    assert config.intermediate_size == 4 * config.hidden_size
    assert theirs["params"] == result["params"] == expected, (theirs["params"], result["params"], expected)
    assert theirs["flops_per_token"] == result["flops_per_token"]


def bert_mlm_params(config) -> int:
    """BERT with its MLM head (the output tied to the token table, its own bias): the token, position and segment
    tables and the embeddings' layer norm; per layer Q/K/V and the attention output with biases, two layer norms, the
    MLP with biases; the head's dense + layer norm and the vocabulary bias. KerasHub's ``BertBackbone`` adds a pooler
    (hidden x hidden + bias)."""
    d, f, v = config.hidden_size, config.intermediate_size, config.vocab_size
    per_layer = 4 * (d * d + d) + 2 * 2 * d + (d * f + f) + (f * d + d)
    return ((v + config.max_position_embeddings + config.type_vocab_size) * d + 2 * d + config.num_layers * per_layer
            + d * d + d + 2 * d + v)


@pytest.mark.parametrize("work", ["gpt_train", "bert_train"])
def test_keras_hub_trains_the_same_model_on_the_same_batch(work, monkeypatch):
    """The training workloads' KerasHub side: a tiny round each, KerasHub's model with flaxzoo's sizes (GPT-2's
    parameters equal; BERT's plus KerasHub's pooler), its first loss ln(vocab) and its loss after the same steps
    near flaxzoo's, and MFU from flaxzoo's FLOPs per token."""
    import math

    monkeypatch.setenv("KERAS_BACKEND", "jax")
    pytest.importorskip("keras_hub")
    [result] = bench.main(["--work", work, "--tiny", "--json", "--steps", "2", "--warmup", "1", "--peak-size", "256",
                           "--compare", "keras_hub"])
    theirs = result["keras_hub"]
    config = bench.workload_spec(work, bench.parse_args(["--work", work, "--tiny"]))["config"]
    if work == "gpt_train":
        assert theirs["params"] == result["params"]
    else:
        d = config.hidden_size
        assert result["params"] == bert_mlm_params(config) and theirs["params"] == result["params"] + d * d + d
    # Both start from random weights (the cross-entropy of near-uniform logits: ln(vocab)) and take the same four
    # AdamW steps on the same batch; the loss is the mean over the same scored tokens.
    assert abs(theirs["first_loss"] - math.log(config.vocab_size)) < 0.3, theirs["first_loss"]
    assert abs(theirs["loss"] - result["loss"]) < 0.3, (theirs["loss"], result["loss"])
    assert theirs["flops_per_token"] == result["flops_per_token"] and theirs["tokens_per_s"] > 0
    assert result["keras_hub_ratio"] == pytest.approx(result["tokens_per_s"] / theirs["tokens_per_s"])


def test_keras_hub_beside_transformers(monkeypatch):
    """``--compare transformers,keras_hub``: both sides, transformers under the keys it always had."""
    result = run_tiny("transformers, keras_hub", monkeypatch)
    for side, prefix in (("transformers", ""), ("keras_hub", "keras_hub_")):
        assert result[side]["tokens_per_s"] > 0 and result[side]["params"] == result["params"]
        assert result[f"{prefix}ratio"] == pytest.approx(result["tokens_per_s"] / result[side]["tokens_per_s"])
        assert len(result[f"{prefix}round_ratios"]) == 1


@pytest.mark.parametrize("argv, message", [
    (["--work", "gpt_generate", "--compare", "llama.cpp"],
     "--compare llama.cpp: only the smollm2_generate workload has a llama.cpp counterpart"),
    (["--work", "smollm2_generate", "--compare", "keras_hub"],
     "--compare keras_hub: only the gpt_generate, gpt_train, bert_train workloads have a KerasHub counterpart "
     "(got --work smollm2_generate)"),
    (["--work", "gpt_train,gpt2_small", "--compare", "transformers,keras_hub"],
     "--compare keras_hub: only the gpt_generate, gpt_train, bert_train workloads have a KerasHub counterpart "
     "(got --work gpt_train,gpt2_small)"),
    (["--work", "gpt_generate", "--compare", "keras"], "--compare 'keras': expected one of"),
    (["--work", "gpt_generate", "--compare", "keras_hub,keras_hub"], "each once"),
    (["--work", "smollm2_generate", "--compare", "llama.cpp,keras_hub"], "llama.cpp (smollm2_generate only) is "
                                                                         "compared alone"),
])
def test_compare_argument_errors(argv, message, capsys):
    """A ``--compare`` a workload has no counterpart for exits with one error line naming the flag (nothing loaded)."""
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    err = capsys.readouterr().err
    assert message in err and err.count("error:") == 1, err


def test_compare_lists_parse():
    """A comma list (spaces allowed) keeps its order; a single side reads as before (``args.compare`` unchanged)."""
    args = bench.parse_args(["--work", "gpt_generate", "--compare", "transformers, keras_hub"])
    assert args.compares == ("transformers", "keras_hub") and args.compare == "transformers,keras_hub"
    for side, work in (("transformers", "gpt_train"), ("keras_hub", "gpt_generate"), ("keras_hub", "bert_train"),
                       ("llama.cpp", "smollm2_generate")):
        args = bench.parse_args(["--work", work, "--compare", side])
        assert (args.compare, args.compares) == (side, (side,))
    assert bench.parse_args(["--work", "gpt_generate"]).compares == ()
