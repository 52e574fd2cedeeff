"""Fine-tune the packaged all-MiniLM-L6-v2 into a token tagger (NER, chunking, POS) on CoNLL-style files.

``python -m flaxzoo.train --config finetune_ner --config.data.train_path=train.txt --config.data.test_path=test.txt``
(a token and its tag per line, the tag in the last column, blank lines between sentences: CoNLL-2003's four columns
read as they are; ``--config.data.validation_path=dev.txt`` scores a validation file at ``eval_every`` and the end).
Each word's tag goes to its first word piece (Hugging Face's ``run_ner.py``); ``WORKDIR/eval/metrics.json`` holds
seqeval's entity F1 (micro), precision, recall, per-type F1 and token accuracy, ``eval/predictions.jsonl`` every test
sentence's true and predicted tags; ``models.from_pretrained(WORKDIR)`` loads the ``BertForTokenClassification``.
The machinery is the fine-tuner's (``train/finetune/tagger.py``): checkpoints and resume, meshes, several processes,
LoRA, layer-wise LR decay, the head alone first.
"""

from flaxzoo.train.finetune.config import base_config


def get_config():
    c = base_config()
    c.task = "tag"
    c.epochs = 3
    c.batch_size = 32
    c.optim.lr = 5e-5
    c.optim.schedule = "linear"
    c.optim.min_lr_ratio = 0.0
    c.optim.weight_decay = 0.01
    c.optim.grad_clip = 1.0
    c.warmup_ratio = 0.1
    c.data.source = "files"
    c.data.max_len = 128
    return c
