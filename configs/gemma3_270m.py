"""Gemma-3-270M's shape (18 layers, 640 wide, 4 heads / 1 KV head of 256, five sliding-window layers of 512 tokens to
one global layer, QK-norm, sandwich norms, a 262,144-token tied vocabulary) for accelerators.

The layers run unrolled (``precision.scan_layers=False``): a scan over sliding and global layers passes the window
as a traced flag, which only a dense mask can take, while unrolled layers give each one its own kernel (splash's
local mask on TPU, cuDNN's window on GPU). See ``gpt2_small.py`` for pointing ``data`` at a real corpus.
"""

from flaxzoo.train.config import accelerator_config, data_fields, model_fields


def get_config():
    c = accelerator_config(batch_size=32, seq_len=1024, lr=1e-3)
    c.precision.scan_layers = False
    c.model = model_fields("gemma-3-270m", max_position_embeddings=4096)
    c.data = data_fields(source="embedded", tokenizer="bpe", vocab_size=262144)
    return c
