"""Encoder-decoder models (T5, BART): an encoder stack read by a decoder stack through cross-attention."""
