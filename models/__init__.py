"""flaxzoo models: shared layers assembled into BERT-style encoders and GPT-style decoders."""

from models.bert import BertForMaskedLM, BertForSequenceClassification, BertModel, EncoderOutput
from models.config import PRESETS, TransformerConfig, get_preset
from models.generate import generate
from models.gpt import GPTForCausalLM, GPTModel
from models.modeling import abstract_model, create_model, default_model_class, param_count

__all__ = [
    "BertForMaskedLM", "BertForSequenceClassification", "BertModel", "EncoderOutput", "GPTForCausalLM", "GPTModel",
    "PRESETS", "TransformerConfig", "abstract_model", "create_model", "default_model_class", "from_pretrained",
    "generate", "get_preset", "param_count", "save_pretrained",
]


def __getattr__(name):
    # hub.py pulls in safetensors and file handling; load it on first use.
    if name in ("from_pretrained", "save_pretrained"):
        from models import hub
        return getattr(hub, name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")
