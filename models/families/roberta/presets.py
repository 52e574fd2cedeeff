"""XLM-RoBERTa base: the published sizes (Hugging Face's ``config.json`` values; ``tests/test_presets.py`` counts their
parameters against transformers' models built from the same configs)."""

from __future__ import annotations

from flaxzoo.models.architectures.encoder.config import encoder_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "xlm-roberta-base": encoder_preset(
        model_type="xlm-roberta", vocab_size=250002, hidden_size=768, num_layers=12, num_heads=12,
        intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1, norm_eps=1e-5, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, position_offset=2),
}
