"""OLMo-2-1B: the published sizes (Hugging Face's ``config.json`` values; ``tests/test_presets.py`` counts their
parameters against transformers' models built from the same configs)."""

from __future__ import annotations

from flaxzoo.models.architectures.decoder.config import decoder_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "olmo-2-1b": decoder_preset(
        model_type="olmo2", vocab_size=100352, hidden_size=2048, num_layers=16, num_heads=16,
        intermediate_size=8192, max_position_embeddings=4096, rope_theta=500_000.0, norm_eps=1e-6,
        norm_placement="post_branch", qk_norm="full", tie_word_embeddings=False, pad_token_id=100277,
        bos_token_id=100257, eos_token_id=100257),
}
