"""Llama-3.2-1B's shape (16 layers, 2048 wide, 32 heads / 8 KV heads, SwiGLU 8192, Llama 3 RoPE scaling,
128,256-token tied vocabulary) for accelerators: pre-training from scratch or continuing from the Hugging Face
checkpoint (``--config.init_from``). Batch 32 x 2048 over FSDP on every device, full remat: the case
``docs/accelerators.md`` compares with MaxText's ``train_compile``.

See ``gpt2_small.py`` for pointing ``data`` at a real corpus.
"""

from flaxzoo.train.config import accelerator_config, data_fields, model_fields


def get_config():
    c = accelerator_config(batch_size=32, seq_len=2048, lr=3e-4, remat="full")
    c.optim.b2 = 0.95
    c.optim.grad_clip = 1.0
    c.model = model_fields("llama-3.2-1b", max_position_embeddings=8192)
    c.data = data_fields(source="embedded", tokenizer="bpe", vocab_size=128256)
    return c
