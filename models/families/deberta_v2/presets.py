"""DeBERTa-v3-small (microsoft/deberta-v3-small's config.json): disentangled relative attention, 256 log buckets: the
published sizes (Hugging Face's ``config.json`` values; ``tests/test_presets.py`` counts their parameters against
transformers' models built from the same configs)."""

from __future__ import annotations

from flaxzoo.models.architectures.encoder.config import encoder_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "deberta-v3-small": encoder_preset(
        model_type="deberta-v2", vocab_size=128100, hidden_size=768, num_layers=6, num_heads=12,
        intermediate_size=3072, position="none", type_vocab_size=0, norm_eps=1e-7, pooler_activation="gelu",
        relative_attention=True, relative_attention_types=("p2c", "c2p"), position_buckets=256,
        share_att_key=True, relative_embedding_norm=True),
}
