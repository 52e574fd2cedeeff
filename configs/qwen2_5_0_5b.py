"""Qwen2.5-0.5B's shape (24 layers, 896 wide, 14 heads / 2 KV heads, biased q/k/v, 151,936-token tied vocabulary)
for accelerators: pre-training from scratch or continuing from the Hugging Face checkpoint (``--config.init_from``).

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
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
    c.optim.lr = 1e-3
    c.optim.warmup_steps = 500
    c.optim.weight_decay = 0.1
    c.precision.remat = "dots"
    c.model = model_fields("qwen2.5-0.5b", max_position_embeddings=4096)
    c.data = data_fields(source="embedded", tokenizer="bpe", vocab_size=151936)
    c.sample.prompt = "The"
    return c
