"""A small Llama-layout decoder (the SmolLM2-135M shape: 30 layers, 576 wide, 9 heads / 3 KV heads, SwiGLU,
RMSNorm, RoPE) for accelerators, with a tensor-parallel axis available (``--config.mesh.tensor=N``).

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
    c.batch_size = 64
    c.seq_len = 1024
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = -1, 1, 1
    c.optim.lr = 3e-3
    c.optim.warmup_steps = 500
    c.optim.weight_decay = 0.1
    c.precision.remat = "dots"
    c.model = model_fields("smollm2-135m", vocab_size=49152, max_position_embeddings=2048)
    c.data = data_fields(source="embedded", tokenizer="bpe", vocab_size=49152)
    c.sample.prompt = "The"
    return c
