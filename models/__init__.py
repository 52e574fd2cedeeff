"""flaxzoo models: shared layers assembled into BERT-style encoders, GPT-style decoders and encoder-decoders."""

import importlib
import importlib.abc
import sys

# First, before the imports below start JAX: on a machine without a GPU or TPU, JAX_PLATFORMS=cpu and no CUDA plugin /
# libtpu start-up noise on standard error (flaxzoo.models.jax_startup says why and what).
from flaxzoo.models.jax_startup import quiet_jax_startup

quiet_jax_startup()

from flaxzoo.models.architectures.decoder import GPTForCausalLM, GPTForSequenceClassification, GPTModel  # noqa: E402
from flaxzoo.models.architectures.encoder import (  # noqa: E402
    BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification, BertModel,
    EncoderOutput)
from flaxzoo.models.architectures.encoder_decoder.model import (  # noqa: E402
    Seq2SeqEncoderModel, Seq2SeqForConditionalGeneration, Seq2SeqForSequenceClassification, Seq2SeqModel)
from flaxzoo.models.config import TransformerConfig  # noqa: E402
from flaxzoo.models.families import PRESETS, get_preset  # noqa: E402
from flaxzoo.models.inference.generate import generate  # noqa: E402
from flaxzoo.models.layers.attention_core import attention_backend  # noqa: E402
from flaxzoo.models.layers.decode_state import DecodeState  # noqa: E402
from flaxzoo.models.layers.embeddings import check_token_ids  # noqa: E402
from flaxzoo.models.modeling import abstract_model, create_model, default_model_class, param_count  # noqa: E402

__all__ = [
    "BertForMaskedLM", "BertForQuestionAnswering", "BertForSequenceClassification", "BertForTokenClassification",
    "BertModel", "EncoderOutput",
    "DecodeState", "GPTForCausalLM", "GPTForSequenceClassification", "GPTModel", "attention_backend", "check_token_ids",
    "Seq2SeqEncoderModel", "Seq2SeqForConditionalGeneration", "Seq2SeqForSequenceClassification", "Seq2SeqModel",
    "PRESETS", "TransformerConfig", "abstract_model", "create_model", "default_model_class", "from_pretrained",
    "generate", "get_preset", "param_count", "save_pretrained", "load_tokenizer", "embed", "generate_text",
    "classify", "apply_chat_template", "SentenceConfig", "SentenceEncoder", "search", "similarity",
]

# Loaded on first use: file formats, tokenizers and orbax are not needed to build and run a model.
_LAZY = {"from_pretrained": "flaxzoo.models.io", "save_pretrained": "flaxzoo.models.io", "load_tokenizer": "flaxzoo.models.io.tokenizer",
         "embed": "flaxzoo.models.inference.sentence_encoder", "generate_text": "flaxzoo.models.inference.text",
         "classify": "flaxzoo.models.inference.classifier", "apply_chat_template": "flaxzoo.models.io.chat",
         "SentenceEncoder": "flaxzoo.models.inference.sentence_encoder",
         "SentenceConfig": "flaxzoo.models.inference.sentence", "search": "flaxzoo.models.inference.sentence",
         "similarity": "flaxzoo.models.inference.sentence"}


# Modules that moved when models/ was grouped into io/, inference/ and adapters/: importing an old name fails in one
# line that names the new one.
MOVED_MODULES = {
    "hub": "io", **{name: f"io.{name}" for name in (
        "checkpoint", "convert", "gguf", "gguf_tokenizers", "tokenizer", "chat", "chat_render")},
    **{name: f"inference.{name}" for name in (
        "generate", "sampling", "text", "sentence", "sentence_encoder", "classifier", "packing")},
    "lora": "adapters.lora", "quantize": "adapters.quantize",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        prefix = __name__ + "."
        if fullname.startswith(prefix):
            head, _, rest = fullname[len(prefix):].partition(".")
            if head in MOVED_MODULES:
                new = prefix + MOVED_MODULES[head] + ("." + rest if rest else "")
                raise ModuleNotFoundError(f"{fullname} has moved: import {new}", name=fullname)
        return None


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")
