"""``flaxzoo.train.flops.flops_per_token``, the one MFU definition of the loop, the bench and the GPU check, against counts by
hand from the configs (layers, hidden, intermediate, vocabulary) and against XLA's own count of the MLM loss."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from flaxzoo.models.architectures.decoder import GPTForCausalLM
from flaxzoo.models.architectures.encoder import BertForMaskedLM
from flaxzoo.models.families import get_preset
from flaxzoo.models.modeling import abstract_model, param_count
from flaxzoo.train import flops as flopslib
from flaxzoo.train.data import DataConfig


def bert_by_hand(config, seq: int) -> tuple[int, int, float]:
    """(N, the MLM head's share of N, 12·L·T·d) of a BERT config, by hand. Per layer: Q, K, V, O with biases, the
    MLP's two matmuls with biases, two LayerNorms (scale + bias); the embedding LayerNorm; the tied token table (as
    the vocabulary projection); the head's transform dense + bias, its LayerNorm, the vocabulary bias. Position and
    token-type tables are lookups."""
    L, d, f, v = config.num_layers, config.hidden_size, config.intermediate_size, config.padded_vocab_size
    layer = (4 * d * d + 4 * d) + (d * f + f + f * d + d) + 2 * (2 * d)
    head = v * d + (d * d + d) + 2 * d + v
    return L * layer + 2 * d + head, head, 12.0 * L * seq * d


def test_bert_base_full_head_and_predictions_by_hand():
    config = get_preset("bert-base-uncased")
    seq = 128
    predictions = DataConfig(seq_len=seq, objective="mlm", tokenizer="wordpiece", vocab_size=30522).predictions
    assert predictions == 20  # ceil(0.15 * 128): the width of masked_positions the loader emits
    n, head, attention = bert_by_hand(config, seq)
    d = config.hidden_size
    assert flopslib.matmul_params(config, BertForMaskedLM) == n
    assert n == param_count(config, BertForMaskedLM) - config.max_position_embeddings * d - config.type_vocab_size * d
    assert flopslib.mlm_head_params(config, BertForMaskedLM) == head

    full = flopslib.flops_per_token(config, seq, BertForMaskedLM)
    gathered = flopslib.flops_per_token(config, seq, BertForMaskedLM, predictions=predictions)
    assert full == pytest.approx(6 * n + attention, rel=1e-12)
    # The head on 20 of 128 positions per row; the encoder on all of them.
    assert gathered == pytest.approx(6 * ((n - head) + head * predictions / seq) + attention, rel=1e-12)
    assert (round(full / 1e6, 1), round(gathered / 1e6, 1)) == (668.9, 547.1)
    assert flopslib.flops_per_token(config, seq, BertForMaskedLM, predictions=seq) == pytest.approx(full)

    # A frozen base (LoRA) keeps its rule on the same N: 4 N + 6 N_trained + 12 L T d.
    n_eff = (n - head) + head * predictions / seq
    assert flopslib.flops_per_token(config, seq, BertForMaskedLM, trained=1000, predictions=predictions) == \
        pytest.approx(4 * n_eff + 6 * 1000 + attention, rel=1e-12)


@pytest.mark.parametrize("pad_vocab_to, vocab", [(1, 50257), (128, 50304)])
def test_gpt2_small_by_hand(pad_vocab_to, vocab):
    """6 N + 12 L T d, with N per layer (Q, K, V, O, MLP with biases, two LayerNorms), the tied table with its padded
    rows, the final LayerNorm; the position table is a lookup."""
    config = get_preset("gpt2", pad_vocab_to=pad_vocab_to)
    L, d, f, seq = 12, 768, 3072, 1024
    assert (config.num_layers, config.hidden_size, config.intermediate_size, config.padded_vocab_size) == \
        (L, d, f, vocab)
    n = L * ((4 * d * d + 4 * d) + (d * f + f + f * d + d) + 4 * d) + vocab * d + 2 * d
    assert flopslib.flops_per_token(config, seq, GPTForCausalLM) == 6 * n + 12 * L * seq * d
    assert round(flopslib.flops_per_token(config, seq, GPTForCausalLM) / 1e6, 1) == (855.2 if vocab == 50257 else
                                                                                    855.4)


def test_predictions_need_a_masked_lm_head_and_a_count_in_range():
    with pytest.raises(ValueError, match="no masked-LM head"):
        flopslib.flops_per_token(get_preset("gpt2-tiny"), 64, GPTForCausalLM, predictions=10)
    with pytest.raises(ValueError, match="predictions=0"):
        flopslib.flops_per_token(get_preset("bert-tiny"), 64, BertForMaskedLM, predictions=0)


def test_predictions_match_xla_count_of_the_mlm_loss():
    """XLA's count of ``flaxzoo.train.losses.masked_lm_loss``'s forward (encoder on every position, head on the gathered
    ``masked_positions``) on the bench's packed batch: a third of ``flops_per_token(..., predictions=P)`` within the
    element-wise ops the formula leaves out (norms, GELU, softmax, the loss: ~2 % at this width). The head counted
    on every position instead would be ~25 % too high."""
    from flaxzoo.train.tools import bench
    from flaxzoo.train.losses import masked_lm_loss

    config = get_preset("bert-base-uncased", vocab_size=4096, hidden_size=512, num_layers=2, num_heads=8,
                        intermediate_size=2048, max_position_embeddings=128, dropout=0.0, attention_dropout=0.0)
    spec = dict(config=config, cls=BertForMaskedLM, batch=2, seq=128, predictions=20)
    batch = {k: jnp.asarray(v) for k, v in bench.make_batch(spec).items()}
    graphdef, state = nnx.split(abstract_model(config, BertForMaskedLM))

    def loss(state, batch):
        return masked_lm_loss(nnx.merge(graphdef, state), batch, with_accuracy=False)

    cost = jax.jit(loss).lower(state, batch).cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    xla_forward = float(cost["flops"]) / (spec["batch"] * spec["seq"])
    formula = flopslib.flops_per_token(config, spec["seq"], BertForMaskedLM, predictions=spec["predictions"]) / 3
    full = flopslib.flops_per_token(config, spec["seq"], BertForMaskedLM) / 3
    assert xla_forward == pytest.approx(formula, rel=0.04), (xla_forward, formula)
    assert abs(xla_forward - full) / full > 0.15


def test_training_doc_states_the_cpu_peak_matmul_the_code_times():
    """docs/training.md names the CPU peak's matmul size: the one ``measure_cpu_peak`` times."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "training.md").read_text()
    sizes = {int(n) for n in re.findall(r"a (\d+) × \1 float32 matmul, 2 · \1³ FLOPs", text)}
    assert sizes == {flopslib.CPU_PEAK_SIZE}, sizes
