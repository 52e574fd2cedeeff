"""GPT-2 medium (355M parameters) for accelerators: parameters and optimizer state sharded over the devices (FSDP),
bf16 compute, dots-saveable remat, layers scanned (one compiled layer body).

See ``gpt2_small.py`` for the data; mix data and FSDP parallelism with ``--config.mesh.data=N``.
"""

from flaxzoo.train.config import accelerator_config, data_fields, model_fields


def get_config():
    c = accelerator_config(batch_size=64, seq_len=1024, lr=3e-4)
    c.precision.scan_layers = True
    c.model = model_fields("gpt2-medium", dropout=0.0, attention_dropout=0.0)
    c.model.pad_vocab_to = 128  # 50,257 rows -> 50,304 = 128 x 393: the table and its moments split over fsdp
    c.data = data_fields(source="embedded", tokenizer="bpe", vocab_size=50257)
    return c
