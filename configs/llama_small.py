"""A small Llama-layout decoder (the SmolLM2-135M shape: 30 layers, 576 wide, 9 heads / 3 KV heads, SwiGLU,
RMSNorm, RoPE) for accelerators, with a tensor-parallel axis available (``--config.mesh.tensor=N``).

See ``gpt2_small.py`` for pointing ``data`` at a real corpus.
"""

from flaxzoo.train.config import accelerator_config, data_fields, model_fields


def get_config():
    c = accelerator_config(batch_size=64, seq_len=1024, lr=3e-3, mesh=(-1, 1, 1))
    c.model = model_fields("smollm2-135m", vocab_size=49152, max_position_embeddings=2048)
    c.data = data_fields(source="embedded", tokenizer="bpe", vocab_size=49152)
    return c
