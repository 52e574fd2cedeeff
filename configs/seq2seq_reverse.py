"""A small T5 (the v1.1 layout) trained from random initialisation to reverse word sequences: the text-to-text task
of ``docs/seq2seq.md``, end to end on the encoder-decoder fine-tuner (``flaxzoo.train.finetune.seq2seq``).

``python -m flaxzoo.train --config seq2seq_reverse`` (a few minutes on 2 CPU cores): 4,000 synthetic pairs ("red cat
one sea" → "sea one cat red"), the test pairs decoded greedily and scored by exact match, ROUGE, BLEU and chrF in
``WORKDIR/eval/metrics.json``; ``models.from_pretrained(WORKDIR)`` loads the ``Seq2SeqForConditionalGeneration``, and
``flaxzoo convert WORKDIR OUT --to hf`` writes a directory transformers' ``T5ForConditionalGeneration`` loads. The
tokenizer is a WordPiece trained on the training pairs (``tokenizer="wordpiece"``: each of the task's words one piece,
about 100 pieces in a table of 128 rows; [PAD] 0 starts the decoder, [SEP] 3 ends a target): a table of MiniLM's
30,522 rows made each step 5x slower for no gain.
"""

from flaxzoo.train.config import model_fields
from flaxzoo.train.finetune.config import base_config


def get_config():
    c = base_config()
    c.task = "seq2seq"
    c.init_from = "scratch"
    c.tokenizer = "wordpiece"
    c.model = model_fields("t5-tiny", vocab_size=128, hidden_size=64, head_dim=16, num_heads=4, num_layers=2,
                           num_decoder_layers=2, intermediate_size=128, pad_token_id=0, eos_token_id=3,
                           decoder_start_token_id=0, dropout=0.0, attention_dropout=0.0)
    c.data.source = "reverse_words"
    c.data.max_len = 16
    c.data.target_max_len = 12
    c.data.group_by_length = False
    c.epochs = 6
    c.batch_size = 32
    c.eval_batch_size = 200
    c.optim.lr = 3e-3
    c.optim.schedule = "linear"
    c.optim.min_lr_ratio = 0.0
    c.optim.weight_decay = 0.01
    c.optim.grad_clip = 1.0
    c.warmup_ratio = 0.05
    c.checkpoint_every = 500
    return c
