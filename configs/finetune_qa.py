"""Fine-tune the packaged all-MiniLM-L6-v2 (or any encoder: ``--config.init_from``) into an extractive question
answerer on SQuAD-style JSON files.

``python -m flaxzoo.train --config finetune_qa --config.data.train_path=train-v1.1.json
--config.data.test_path=dev-v1.1.json`` (``{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
"answers": [{"text", "answer_start"}]}]}]}]}``). BERT's SQuAD v1.1 recipe (Devlin et al., 2019): windows of 384
pieces every 128 context pieces, questions cut to 64 pieces, answers of at most 30 pieces, 2 epochs at 3e-5 with a
linear decay after a 10% warmup. ``WORKDIR/eval/metrics.json`` holds the official v1.1 script's exact match and F1,
``eval/predictions.jsonl`` every dev question's predicted and gold answers; ``models.from_pretrained(WORKDIR)`` loads
the family's question-answering model (``BertForQuestionAnswering`` for BERT / RoBERTa). The machinery is the
fine-tuner's (``train/finetune/qa.py``): checkpoints and resume, meshes, several processes, LoRA, layer-wise LR decay,
the head alone first.
"""

from flaxzoo.train.finetune.config import base_config


def get_config():
    c = base_config()
    c.task = "qa"
    c.epochs = 2
    c.batch_size = 32
    c.optim.lr = 3e-5
    c.optim.schedule = "linear"
    c.optim.min_lr_ratio = 0.0
    c.optim.weight_decay = 0.01
    c.optim.grad_clip = 1.0
    c.warmup_ratio = 0.1
    c.data.source = "files"
    c.data.max_len = 384
    c.data.doc_stride = 128
    c.data.max_query_length = 64
    c.data.max_answer_length = 30
    return c
