"""Gemma-3-270M's shape (18 layers, 640 wide, 4 heads / 1 KV head of 256, five sliding-window layers of 512 tokens to
one global layer, QK-norm, sandwich norms, a 262,144-token tied vocabulary) for accelerators.

The layers run unrolled (``precision.scan_layers=False``): a scan over sliding and global layers passes the window
as a traced flag, which only a dense mask can take, while unrolled layers give each one its own kernel (splash's
local mask on TPU, cuDNN's window on GPU). See ``gpt2_small.py`` for pointing ``data`` at a real corpus.
"""

from flaxzoo.train.config import base_config, data_fields, model_fields


def get_config():
    c = base_config()
    c.steps = 10000
    c.log_every = 10
    c.eval_every = 1000
    c.eval_batches = 20
    c.checkpoint_every = 1000
    c.batch_size = 32
    c.seq_len = 1024
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
    c.optim.lr = 1e-3
    c.optim.warmup_steps = 500
    c.optim.weight_decay = 0.1
    c.precision.remat = "dots"
    c.precision.scan_layers = False
    c.model = model_fields("gemma-3-270m", max_position_embeddings=4096)
    c.data = data_fields(source="embedded", tokenizer="bpe", vocab_size=262144)
    c.sample.prompt = "The"
    return c
