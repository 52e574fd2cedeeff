"""A tiny ModernBERT (``modernbert-tiny``: pre-LN, GeGLU, RoPE, bias-free LayerNorms, global and bidirectional
sliding-window layers) pre-trained with masked-LM on the embedded corpus (WordPiece), a few minutes on 2 CPU cores.

``python -m flaxzoo.train --config configs/modernbert_tiny.py``: evaluation reports masked-token accuracy.

The masked-LM batches are packed rows of documents with ``segment_ids`` (``train/data/packing.py``): attention stays
inside a document, positions restart at each, and the local layers' windows stay inside it, which is what
Hugging Face's ModernBERT gets by unpadding.
"""

from flaxzoo.train.config import base_config, data_fields, model_fields


def get_config():
    c = base_config()
    c.steps = 600
    c.log_every = 20
    c.eval_every = 200
    c.checkpoint_every = 200
    c.batch_size = 16
    c.seq_len = 128
    c.optim.lr = 1e-3
    c.optim.warmup_steps = 50
    c.optim.weight_decay = 0.01
    c.optim.b2 = 0.98
    c.optim.schedule = "linear"
    # Three layers: global, local, local; the local ones see 16 tokens each side (local_attention 32).
    c.model = model_fields("modernbert-tiny", vocab_size=2048, hidden_size=128, num_layers=3, num_heads=4,
                           intermediate_size=192, sliding_window=17, dropout=0.0, attention_dropout=0.0)
    c.model.max_position_embeddings = c.get_ref("seq_len")
    c.data = data_fields(source="embedded", tokenizer="wordpiece", mask_prob=0.3)
    c.data.vocab_size = c.model.get_ref("vocab_size")
    return c
