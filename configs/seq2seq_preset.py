"""An encoder-decoder preset (``--config.model.preset``: t5-small / base / large, flan-t5-small / base / large,
mt5-small / base, umt5-small / base, bart-base / large) trained from random initialisation on your JSONL pairs
(``--config.data.train_path=train.jsonl --config.data.test_path=test.jsonl``, fields ``source`` and ``target``):
the text-to-text fine-tuner (``flaxzoo.train.finetune.seq2seq``) at a preset's size, and what
``python -m flaxzoo.train.compile --config seq2seq_preset --config.model.preset=flan-t5-base --target v5e-8``
compiles for an accelerator. Fine-tuning a pretrained checkpoint instead: ``--config.init_from=DIR_OR_HUB_ID
--config.model.preset= --config.tokenizer=DIR_OR_HUB_ID`` (its own architecture and tokenizer).
"""

from flaxzoo.train.config import model_fields
from flaxzoo.train.finetune.classifier import packaged_minilm
from flaxzoo.train.finetune.config import base_config


def get_config():
    c = base_config()
    c.task = "seq2seq"
    c.init_from = "scratch"
    c.tokenizer = str(packaged_minilm())
    c.model = model_fields("t5-small")
    c.data.source = "files"
    c.data.text_field = "source"
    c.data.target_field = "target"
    c.data.max_len = 512
    c.data.target_max_len = 128
    c.epochs = 3
    c.batch_size = 64
    c.eval_batch_size = 64
    c.optim.lr = 1e-3
    c.optim.schedule = "linear"
    c.optim.min_lr_ratio = 0.0
    c.optim.grad_clip = 1.0
    c.warmup_ratio = 0.05
    return c
