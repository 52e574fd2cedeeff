"""A small encoder trained from random initialisation on the BBC headline split: the position-encoding
comparison of docs/fine-tuning.md, for real. Same model, data, seed and schedule; only ``model.position`` changes.

``python -m flaxzoo.train --config configs/headlines_from_scratch.py --config.model.position=alibi`` (learned | sinusoidal |
rope | alibi; under a minute on 2 CPU cores). ``python -m flaxzoo.train.finetune.results positions`` runs the four schemes
with three seeds each and prints the table the README shows. The tokenizer is MiniLM's WordPiece vocabulary (only its
vocabulary: the weights start from random).
"""

from flaxzoo.train.config import model_fields
from flaxzoo.train.finetune.config import base_config
from flaxzoo.train.finetune.classifier import packaged_minilm


def get_config():
    c = base_config()
    c.init_from = "scratch"
    c.tokenizer = str(packaged_minilm())
    c.model = model_fields("bert-tiny", vocab_size=30522, hidden_size=128, num_layers=2, num_heads=4,
                           intermediate_size=512, max_position_embeddings=64, dropout=0.1, attention_dropout=0.1,
                           position="learned")
    c.epochs = 20
    c.batch_size = 32
    c.optim.lr = 1e-3
    c.optim.schedule = "linear"
    c.optim.min_lr_ratio = 0.0
    c.optim.b2 = 0.999
    c.optim.weight_decay = 0.01
    c.optim.grad_clip = 1.0
    c.warmup_ratio = 0.1
    c.data.max_len = 64
    return c
