"""A small T5 (the v1.1 layout) pre-trained from random initialisation by T5's span-corruption objective on the
embedded corpus (``flaxzoo.train.finetune.span_pretrain``; ``docs/seq2seq.md``).

``python -m flaxzoo.train --config span_corruption`` (a few minutes on 2 CPU cores): Python's documentation topics and
standard-library docstrings as MiniLM's WordPiece pieces, 5 % of the documents held out; rows of 70 pieces corrupted
into 64 encoder tokens and 14-token targets (15 % noise in spans of mean 3, drawn afresh each epoch); the held-out
rows' target loss, perplexity and accuracy beside a unigram baseline in ``WORKDIR/eval/metrics.json``. MiniLM's
vocabulary has no ``<extra_id_k>`` tokens: the sentinels take the ids past its 30,522 (T5's convention), which the
model's table of 30,528 rows holds. ``data.train_path`` names your own text or JSONL files instead.
"""

from flaxzoo.configs import seq2seq_reverse
from flaxzoo.train.config import model_fields
from flaxzoo.train.finetune.classifier import packaged_minilm
from flaxzoo.train.finetune.config import base_config


def get_config():
    c = seq2seq_reverse.get_config()  # its optimizer, schedule and checkpoints; MiniLM's pieces, a wider model
    c.tokenizer = str(packaged_minilm())
    c.model = model_fields("t5-tiny", vocab_size=30528, hidden_size=128, head_dim=32, num_heads=4, num_layers=2,
                           num_decoder_layers=2, intermediate_size=256, pad_token_id=0, eos_token_id=102,
                           decoder_start_token_id=0, dropout=0.0, attention_dropout=0.0)
    c.data.source = "span_corruption"
    c.data.max_len = 64
    c.data.target_max_len = base_config().data.target_max_len  # unset: the targets' width follows from max_len
    c.epochs = 1
    c.eval_batch_size = 128
    return c
