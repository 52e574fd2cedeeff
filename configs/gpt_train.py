"""The benchmark's ``gpt_train`` model and batch, trained by the main job on the embedded corpus: GPT-2 layout,
vocabulary 8192 (a BPE tokenizer trained on the corpus), 6 layers × 384, 6 heads, MLP 1536, 256 positions, batch
8 × 256, no dropout.

``python -m flaxzoo.train --config gpt_train`` is what ``python -m flaxzoo.train.bench --work main_gpt_train`` times next to the
bench's own ``gpt_train`` step: the same step function (``flaxzoo.train.step``), plus real data, the loop's metrics,
evaluation and checkpoints.
"""

from flaxzoo.train.config import base_config, data_fields, model_fields


def get_config():
    c = base_config()
    c.steps = 60
    c.log_every = 10
    c.eval_every = 0  # only at the end
    c.checkpoint_every = 0
    c.batch_size = 8
    c.seq_len = 256
    c.optim.lr = 3e-4
    c.optim.warmup_steps = 10
    c.model = model_fields("gpt2-tiny", vocab_size=8192, hidden_size=384, num_layers=6, num_heads=6,
                           intermediate_size=1536, max_position_embeddings=256, dropout=0.0, attention_dropout=0.0)
    c.data = data_fields(source="embedded", tokenizer="bpe", vocab_size=8192)
    c.sample.max_new_tokens = 0
    return c
