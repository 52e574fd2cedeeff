"""GPT-2 medium (355M parameters) for accelerators: parameters and optimizer state sharded over the devices (FSDP),
bf16 compute, dots-saveable remat, layers scanned (one compiled layer body).

See ``gpt2_small.py`` for the data; mix data and FSDP parallelism with ``--config.mesh.data=N``.
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
    c.optim.lr = 3e-4
    c.optim.warmup_steps = 500
    c.optim.weight_decay = 0.1
    c.precision.remat = "dots"
    c.precision.scan_layers = True
    c.model = model_fields("gpt2-medium", dropout=0.0, attention_dropout=0.0)
    c.model.pad_vocab_to = 128  # 50,257 rows -> 50,304 = 128 x 393: the table and its moments split over fsdp
    c.data = data_fields(source="embedded", tokenizer="bpe", vocab_size=50257)
    c.sample.prompt = "The"
    return c
