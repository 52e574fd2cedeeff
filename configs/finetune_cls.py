"""Fine-tune the packaged all-MiniLM-L6-v2 into a BBC News headline classifier (5 classes), with the recipe.

``python -m flaxzoo.train --config configs/finetune_cls.py`` (about a minute on 2 CPU cores) writes ``WORKDIR/eval/``
(``metrics.json``, ``confusion_matrix.png``, ``errors.jsonl``) and a checkpoint that ``models.from_pretrained(WORKDIR)``
loads as the classifier. Another encoder: ``--config.init_from=PATH_OR_HUB_ID``; your data:
``--config.data.source=files --config.data.train_path=FILE.csv`` (``text`` / ``label`` columns, or set
``data.text_field`` / ``data.label_field``).

The recipe (each practice one switch; the README has the ablation, ``train/finetune/RESULTS.md`` the lab notes):
- layer-wise LR decay 0.8 (embeddings learn at 0.8^7 of ``optim.lr``, the top layer at 0.8);
- the head alone for about the first epoch (``freeze_steps``) at a 10x higher rate (``head_lr``), then everything
  (linear probing, then fine-tuning: Kumar et al., 2022);
- gradient clipping at 1.0, 10% warmup then linear decay;
- frequent words the tokenizer cuts into 3+ pieces added to the vocabulary;
- head + tail truncation (no effect on headlines, which are shorter than ``max_len``; it matters for long texts).

LoRA instead of the full fine-tune: ``--config.lora.rank=8 --config.optim.lr=1e-3`` (alpha 16, adapters on every
attention and MLP projection, the new pooler + classifier trained in full: ``lora.train_fully`` "" means ``head``);
the encoder stays frozen (no gradients, no optimizer state), the recipe's other switches act as before (layer decay on
the adapters, the head alone first). 1e-3 was chosen over the recipe's 2e-4 on the validation hold-out
(``data.validation_fraction=0.15``, seed 0: macro-F1 0.885 vs 0.856); ``train/finetune/RESULTS.md`` has the run. The
checkpoint is the merged classifier (``models.from_pretrained(WORKDIR)`` as for a full fine-tune).
"""

from flaxzoo.train.finetune.config import base_config


def get_config():
    c = base_config()
    c.epochs = 8
    c.batch_size = 32
    c.optim.lr = 2e-4
    c.optim.schedule = "linear"
    c.optim.min_lr_ratio = 0.0
    c.optim.b2 = 0.999
    c.optim.weight_decay = 0.01
    c.optim.grad_clip = 1.0
    c.optim.layer_decay = 0.8
    c.warmup_ratio = 0.1
    c.freeze_steps = 50  # about one epoch of BBC headlines: the head alone, at head_lr
    c.head_lr = 2e-3
    c.vocab.frequent = True
    c.data.max_len = 64
    c.data.truncation = "head_tail"
    return c
