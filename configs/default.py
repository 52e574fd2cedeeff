"""The default job: a tiny GPT (GPT-2 layout) on the embedded corpus, sized to finish in minutes on 2 CPU cores.

``python -m flaxzoo.train`` trains it into ``runs/default``. Every key is documented in ``train/config.py``.
"""

from flaxzoo.train.config import base_config, data_fields, model_fields


def get_config():
    c = base_config()
    c.steps = 800
    c.log_every = 20
    c.eval_every = 200
    c.checkpoint_every = 200
    c.batch_size = 16
    c.seq_len = 128
    c.optim.lr = 3e-3
    c.optim.warmup_steps = 50
    c.optim.weight_decay = 0.1
    c.model = model_fields("gpt2-tiny", vocab_size=2048, hidden_size=128, num_layers=4, num_heads=4,
                           intermediate_size=512, dropout=0.0, attention_dropout=0.0)
    c.model.max_position_embeddings = c.get_ref("seq_len")
    c.data = data_fields(source="embedded", tokenizer="bpe")
    c.data.vocab_size = c.model.get_ref("vocab_size")
    c.sample.prompt = "Return the"
    return c
