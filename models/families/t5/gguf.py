"""T5 in llama.cpp's GGUF files: ``general.architecture = "t5"`` (``T5ForConditionalGeneration``, mT5 and umT5
alike) and ``"t5encoder"`` (``T5EncoderModel``); the tensor names and the config the metadata describes.

Facts of llama.cpp's converter (``convert_hf_to_gguf.py``, ``T5Model`` / ``T5EncoderModel``) and of gguf-py's
``TensorNameMap`` these readers rely on:

* Names: ``token_embd`` (the shared table, whichever of ``shared`` / ``encoder.embed_tokens`` /
  ``decoder.embed_tokens`` the checkpoint stores first), ``output`` (the LM head, only when the checkpoint stores one:
  absent means tied), per layer ``enc.blk.N.`` / ``dec.blk.N.`` + ``attn_norm``, ``attn_q`` / ``attn_k`` / ``attn_v``
  / ``attn_o``, ``attn_rel_b`` (the relative-bias table: layer 0 only in T5 and mT5, every layer in umT5),
  ``ffn_norm``, ``ffn_gate`` (``wi_0``, gated feed-forwards only) / ``ffn_up`` (``wi`` or ``wi_1``) / ``ffn_down``;
  the decoder's ``cross_attn_norm``, ``cross_attn_q`` / ``_k`` / ``_v`` / ``_o``; ``enc.output_norm``,
  ``dec.output_norm``.
* Metadata under ``t5.`` / ``t5encoder.``: ``block_count``, ``decoder_block_count`` (when ``config.json`` names
  ``num_decoder_layers``), ``embedding_length``, ``feed_forward_length``, ``attention.head_count`` /
  ``key_length`` / ``value_length``, ``attention.layer_norm_epsilon`` / ``layer_norm_rms_epsilon``,
  ``attention.relative_buckets_count``, ``decoder_start_token_id``, ``context_length``.
* Not written, so read from the tensors or taken at llama.cpp's values: the feed-forward (gated GELU when
  ``ffn_gate`` tensors exist, else ReLU), tied embeddings (no ``output`` tensor; then the decoder output is scaled by
  ``d_model ** -0.5``, T5 v1.0's rule), per-layer relative bias (umT5: ``attn_rel_b`` beyond layer 0), the bias's
  maximum distance (128).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Collection

from flaxzoo.models.architectures.decoder.gguf import metadata_float, token_id, vocab_size
from flaxzoo.models.families.base import GGUFSpec

if TYPE_CHECKING:
    from flaxzoo.models.io.gguf import GGUFFile

# Hugging Face module inside a block's sub-layer → llama.cpp's tensor, per stack.
_ENCODER = {"layer.0.layer_norm": "attn_norm", "layer.0.SelfAttention.relative_attention_bias": "attn_rel_b",
            **{f"layer.0.SelfAttention.{p}": f"attn_{p}" for p in "qkvo"},
            "layer.1.layer_norm": "ffn_norm", "layer.1.DenseReluDense.wi": "ffn_up",
            "layer.1.DenseReluDense.wi_0": "ffn_gate", "layer.1.DenseReluDense.wi_1": "ffn_up",
            "layer.1.DenseReluDense.wo": "ffn_down"}
_DECODER = {"layer.0.layer_norm": "attn_norm", "layer.0.SelfAttention.relative_attention_bias": "attn_rel_b",
            **{f"layer.0.SelfAttention.{p}": f"attn_{p}" for p in "qkvo"},
            "layer.1.layer_norm": "cross_attn_norm",
            **{f"layer.1.EncDecAttention.{p}": f"cross_attn_{p}" for p in "qkvo"},
            "layer.2.layer_norm": "ffn_norm", "layer.2.DenseReluDense.wi": "ffn_up",
            "layer.2.DenseReluDense.wi_0": "ffn_gate", "layer.2.DenseReluDense.wi_1": "ffn_up",
            "layer.2.DenseReluDense.wo": "ffn_down"}
NAMES: tuple[tuple[str, str], ...] = (
    (r"shared\.weight", "token_embd.weight"), (r"(encoder|decoder)\.embed_tokens\.weight", "token_embd.weight"),
    (r"lm_head\.weight", "output.weight"),
    (r"encoder\.final_layer_norm\.weight", "enc.output_norm.weight"),
    (r"decoder\.final_layer_norm\.weight", "dec.output_norm.weight"),
    *((rf"{stack}\.block\.(\d+)\.{re.escape(module)}\.weight", rf"{short}.blk.\1.{tensor}.weight")
      for stack, short, table in (("encoder", "enc", _ENCODER), ("decoder", "dec", _DECODER))
      for module, tensor in table.items()),
)


def t5_config_from_gguf(file: GGUFFile, names: Collection[str]) -> dict[str, Any]:
    """The Hugging Face ``config.json`` a ``t5`` / ``t5encoder`` GGUF describes (``names``: its tensor names): a
    ``umt5`` config when every layer has its relative-bias table, else ``t5`` (mT5's files read as T5 v1.1, the same
    computation)."""
    names = set(names)
    required = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                "attention.key_length")
    missing = [f"{file.architecture}.{k}" for k in required if file.arch(k) is None]
    if missing:
        raise ValueError(f"{file.path}: GGUF metadata lacks {', '.join(missing)}")
    layers = int(file.arch("block_count"))
    encoder_only = file.architecture == "t5encoder"
    per_layer = layers > 1 and "enc.blk.1.attn_rel_b.weight" in names
    model_type = "umt5" if per_layer else "t5"
    epsilon = file.arch("attention.layer_norm_rms_epsilon", file.arch("attention.layer_norm_epsilon", 1e-6))
    head = "T5EncoderModel" if encoder_only else f"{'UMT5' if per_layer else 'T5'}ForConditionalGeneration"
    out = {"model_type": model_type, "architectures": [head], "vocab_size": vocab_size(file),
           "d_model": int(file.arch("embedding_length")), "d_ff": int(file.arch("feed_forward_length")),
           "d_kv": int(file.arch("attention.key_length")), "num_heads": int(file.arch("attention.head_count")),
           "num_layers": layers, "num_decoder_layers": int(file.arch("decoder_block_count", layers)),
           "relative_attention_num_buckets": int(file.arch("attention.relative_buckets_count", 32)),
           "relative_attention_max_distance": 128, "layer_norm_epsilon": metadata_float(epsilon),
           "feed_forward_proj": "gated-gelu" if "enc.blk.0.ffn_gate.weight" in names else "relu",
           "tie_word_embeddings": "output.weight" not in names, "is_encoder_decoder": not encoder_only,
           "decoder_start_token_id": int(file.arch("decoder_start_token_id", 0)),
           "pad_token_id": token_id(file, "padding_token_id") or 0,
           "eos_token_id": token_id(file, "eos_token_id") if token_id(file, "eos_token_id") is not None else 1}
    if per_layer and out["tie_word_embeddings"]:
        raise ValueError(f"{file.path}: a umT5 file (a relative-bias table in every layer) without an output tensor; "
                         "umT5's head is never tied, expected output.weight")
    return out


# The files' SentencePiece unigram tokenizers (tokenizer.ggml.model "t5") are not rebuilt: no reference here to test one
# against (transformers' GGUF loader has no T5 tokenizer, sentencepiece is not installed).
SPEC = GGUFSpec(architectures=("t5", "t5encoder"), config=t5_config_from_gguf, names=NAMES, tokenizers=(),
                rope_layout="half")
