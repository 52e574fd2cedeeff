"""T5 v1.0 (t5-small / base / large) and Flan-T5 (the v1.1 layout: gated GELU, untied head, no output scaling), and a
tiny one for tests: the published sizes (Hugging Face's ``config.json`` values)."""

from __future__ import annotations

from flaxzoo.models.architectures.encoder_decoder.config import V1_1, t5_preset
from flaxzoo.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "t5-small": t5_preset(hidden_size=512, intermediate_size=2048, num_layers=6, num_heads=8),
    "t5-base": t5_preset(hidden_size=768, intermediate_size=3072, num_layers=12, num_heads=12),
    "t5-large": t5_preset(hidden_size=1024, intermediate_size=4096, num_layers=24, num_heads=16),
    "flan-t5-small": t5_preset(hidden_size=512, intermediate_size=1024, num_layers=8, num_heads=6, **V1_1),
    "flan-t5-base": t5_preset(hidden_size=768, intermediate_size=2048, num_layers=12, num_heads=12, **V1_1),
    "flan-t5-large": t5_preset(hidden_size=1024, intermediate_size=2816, num_layers=24, num_heads=16, **V1_1),
    "t5-tiny": t5_preset(vocab_size=1000, hidden_size=64, head_dim=16, intermediate_size=128, num_layers=2,
                         num_heads=4, position_bias_buckets=16, position_bias_max_distance=64, dropout=0.0,
                         attention_dropout=0.0, **V1_1),
}
