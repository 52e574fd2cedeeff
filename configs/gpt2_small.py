"""GPT-2 small (124M parameters) for accelerators: bf16 compute, fp32 parameters, data parallel over every device.

The hyper-parameters follow nanoGPT's GPT-2 reproduction (AdamW 6e-4, betas 0.9/0.95, weight decay 0.1, clip 1.0,
warmup then cosine to 10 %). The embedded corpus is small (about half a million tokens); point ``data`` at a real
corpus for a real run, e.g. ``--config.data.source=tfds:lm1b`` (prepared once, array_record) or
``--config.data.source=files --config.data.paths="('/data/*.jsonl',)"``.
"""

from flaxzoo.train.config import base_config, data_fields, model_fields


def get_config():
    c = base_config()
    c.steps = 5000
    c.log_every = 10
    c.eval_every = 500
    c.eval_batches = 20
    c.checkpoint_every = 1000
    c.batch_size = 64  # x 1024 tokens = 65,536 tokens per step
    c.seq_len = 1024
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = -1, 1, 1
    c.optim.lr = 6e-4
    c.optim.warmup_steps = 200
    c.optim.b2 = 0.95
    c.optim.weight_decay = 0.1
    c.optim.grad_clip = 1.0
    c.optim.accum_steps = 1  # raise it when the per-device batch does not fit
    c.precision.compute_dtype = "auto"  # bfloat16 on GPU / TPU
    c.model = model_fields("gpt2", dropout=0.0, attention_dropout=0.0)
    c.model.pad_vocab_to = 128  # 50,257 rows -> 50,304 = 128 x 393: the table and its moments split over fsdp
    c.data = data_fields(source="embedded", tokenizer="bpe", vocab_size=50257, tokenizer_max_docs=0)
    c.sample.prompt = "The"
    return c
