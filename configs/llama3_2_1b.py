"""Llama-3.2-1B's shape (16 layers, 2048 wide, 32 heads / 8 KV heads, SwiGLU 8192, Llama 3 RoPE scaling,
128,256-token tied vocabulary) for accelerators: pre-training from scratch or continuing from the Hugging Face
checkpoint (``--config.init_from``). Batch 32 x 2048 over FSDP on every device, full remat: the case
``docs/accelerators.md`` compares with MaxText's ``train_compile``.

See ``gpt2_small.py`` for pointing ``data`` at a real corpus.
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
    c.seq_len = 2048
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
    c.optim.lr = 3e-4
    c.optim.warmup_steps = 500
    c.optim.b2 = 0.95
    c.optim.weight_decay = 0.1
    c.optim.grad_clip = 1.0
    c.precision.remat = "full"
    c.model = model_fields("llama-3.2-1b", max_position_embeddings=8192)
    c.data = data_fields(source="embedded", tokenizer="bpe", vocab_size=128256)
    c.sample.prompt = "The"
    return c
