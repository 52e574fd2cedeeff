"""BERT base (110M parameters) masked-LM pre-training for accelerators, with BERT's optimiser settings (AdamW 1e-4,
betas 0.9/0.999, eps 1e-6, weight decay 0.01, linear warmup and decay) and sequences of 128 tokens.

See ``gpt2_small.py`` for pointing ``data`` at a real corpus.
"""

from flaxzoo.train.config import base_config, data_fields, model_fields


def get_config():
    c = base_config()
    c.steps = 100000
    c.log_every = 50
    c.eval_every = 5000
    c.eval_batches = 20
    c.checkpoint_every = 5000
    c.batch_size = 256
    c.seq_len = 128
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = -1, 1, 1
    c.optim.lr = 1e-4
    c.optim.schedule = "linear"
    c.optim.min_lr_ratio = 0.0
    c.optim.warmup_steps = 10000
    c.optim.b2 = 0.999
    c.optim.eps = 1e-6
    c.optim.weight_decay = 0.01
    c.model = model_fields("bert-base-uncased", max_position_embeddings=512)
    c.data = data_fields(source="embedded", tokenizer="wordpiece", vocab_size=30522, lowercase=True)
    return c
