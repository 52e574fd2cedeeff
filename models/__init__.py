"""flaxzoo models: shared layers assembled into BERT-style encoders and GPT-style decoders."""

# First, before the imports below start JAX: on a machine without a GPU or TPU, JAX_PLATFORMS=cpu and no CUDA plugin /
# libtpu start-up noise on standard error (flaxzoo.models.jax_startup says why and what).
from flaxzoo.models.jax_startup import quiet_jax_startup

quiet_jax_startup()

from flaxzoo.models.architectures.decoder import GPTForCausalLM, GPTForSequenceClassification, GPTModel  # noqa: E402
from flaxzoo.models.architectures.encoder import (  # noqa: E402
    BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification, BertModel,
    EncoderOutput)
from flaxzoo.models.config import TransformerConfig  # noqa: E402
from flaxzoo.models.families import PRESETS, get_preset  # noqa: E402
from flaxzoo.models.generate import generate  # noqa: E402
from flaxzoo.models.layers.attention_core import attention_backend  # noqa: E402
from flaxzoo.models.layers.decode_state import DecodeState  # noqa: E402
from flaxzoo.models.layers.embeddings import check_token_ids  # noqa: E402
from flaxzoo.models.modeling import abstract_model, create_model, default_model_class, param_count  # noqa: E402

__all__ = [
    "BertForMaskedLM", "BertForQuestionAnswering", "BertForSequenceClassification", "BertForTokenClassification",
    "BertModel", "EncoderOutput",
    "DecodeState", "GPTForCausalLM", "GPTForSequenceClassification", "GPTModel", "attention_backend", "check_token_ids",
    "PRESETS", "TransformerConfig", "abstract_model", "create_model", "default_model_class", "from_pretrained",
    "generate", "get_preset", "param_count", "save_pretrained", "load_tokenizer", "embed", "generate_text",
    "classify", "apply_chat_template", "SentenceConfig", "SentenceEncoder", "search", "similarity",
]

# Loaded on first use: file formats, tokenizers and orbax are not needed to build and run a model.
_LAZY = {"from_pretrained": "flaxzoo.models.hub", "save_pretrained": "flaxzoo.models.hub", "load_tokenizer": "flaxzoo.models.tokenizer",
         "embed": "flaxzoo.models.sentence_encoder", "generate_text": "flaxzoo.models.text",
         "classify": "flaxzoo.models.classifier", "apply_chat_template": "flaxzoo.models.chat",
         "SentenceEncoder": "flaxzoo.models.sentence_encoder",
         "SentenceConfig": "flaxzoo.models.sentence", "search": "flaxzoo.models.sentence",
         "similarity": "flaxzoo.models.sentence"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")
