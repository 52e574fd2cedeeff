"""The decoder architecture: the causal stack and its heads (``model.py``), what the Llama-layout families share in
Hugging Face's files (``hf.py``) and in llama.cpp's GGUF files (``gguf.py``)."""

from flaxzoo.models.architectures.decoder.model import GPTForCausalLM, GPTForSequenceClassification, GPTModel

__all__ = ["GPTForCausalLM", "GPTForSequenceClassification", "GPTModel"]
