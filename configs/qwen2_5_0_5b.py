"""Qwen2.5-0.5B's shape (24 layers, 896 wide, 14 heads / 2 KV heads, biased q/k/v, 151,936-token tied vocabulary)
for accelerators: pre-training from scratch or continuing from the Hugging Face checkpoint (``--config.init_from``).

See ``gpt2_small.py`` for pointing ``data`` at a real corpus.
"""

from flaxzoo.train.config import accelerator_config, data_fields, model_fields


def get_config():
    c = accelerator_config(batch_size=64, seq_len=1024, lr=1e-3)
    c.model = model_fields("qwen2.5-0.5b", max_position_embeddings=4096)
    c.data = data_fields(source="embedded", tokenizer="bpe", vocab_size=151936)
    return c
