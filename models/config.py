"""One frozen config for every model in the zoo, validated at construction (the named presets live with their
families: ``flaxzoo.models.families.PRESETS``).

A config describes mechanisms, not model names: an encoder is ``causal=False`` with post-LN blocks and learned
positions, a GPT-2 is ``causal=True`` with pre-LN blocks and learned positions, a Llama is pre-LN with RMSNorm,
SwiGLU and RoPE. ``model_type`` only records which Hugging Face layout the weights come from / go to.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from flaxzoo.models.config_checks import (ACTIVATIONS, ATTENTION_IMPLS, CLASSIFIER_POOLINGS, DTYPES, LAYER_TYPES,
                                          NORM_PLACEMENTS, NORMS, POSITION_SCHEMES, QK_NORMS, RELATIVE_ATTENTION_TYPES,
                                          REMAT_POLICIES, ROPE_LAYOUTS, FieldError, validate)

# The allowed values and FieldError are defined beside the checks and named here too, where users import them.
__all__ = ["ACTIVATIONS", "ATTENTION_IMPLS", "CLASSIFIER_POOLINGS", "DTYPES", "LAYER_TYPES", "NORM_PLACEMENTS", "NORMS",
           "POSITION_SCHEMES", "QK_NORMS", "RELATIVE_ATTENTION_TYPES", "REMAT_POLICIES", "ROPE_LAYOUTS", "FieldError",
           "TransformerConfig", "default_embedding_multiplier"]


# The model-level encoder-decoder fields a single stack's view of the config does not carry.
_STACK_VIEW: dict[str, Any] = dict(lm_head_bias=False, decoder_start_from_source=False)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of an encoder-only or decoder-only Transformer.

    ``num_kv_heads`` < ``num_heads`` gives grouped-query attention (1 = multi-query). ``head_dim`` defaults to
    ``hidden_size // num_heads``. ``mlp_gated`` with ``activation="silu"`` is SwiGLU.

    ``remat`` and ``scan_layers`` change how the layer stack is executed, never its parameters or its outputs:
    ``remat="full"`` recomputes each layer's activations in the backward pass, ``"dots"`` keeps the results of the
    weight matmuls and recomputes the rest, ``"none"`` keeps everything; ``scan_layers`` runs the layers as one
    ``lax.scan`` over their stacked parameters (one compiled layer body instead of ``num_layers`` copies). ``remat``
    applies to full-sequence forward passes only (training, evaluation); cached decoding never recomputes.
    Cached decoding runs layer by layer whatever ``scan_layers`` says, each layer writing its own KV buffer in place
    (stacked parameters are sliced once per ``generate`` call: ``models/layers/DECODING.md``).
    ``attention_impl`` picks the attention core (same outputs): ``"fused"`` is ``jax.nn.dot_product_attention``
    (cuDNN flash attention on GPU where cuDNN takes the shapes, XLA otherwise), ``"softmax"`` the kernel with a
    closed-form backward (``models/layers/softmax_kernel.py``), ``"splash"`` Pallas' TPU splash attention and
    ``"gpu_flash"`` Pallas' Triton GPU flash attention (``models/layers/attention_kernels.py``; both run in Pallas
    interpret mode on CPU), ``"auto"`` by the platform the step is compiled for: splash on TPU, cuDNN (plain
    causal) or the Pallas GPU kernel (packed documents, padding) on GPU, the softmax kernel on CPU
    (``models.attention_backend`` says which one a call gets, and why).

    ``dropout`` is the residual / embedding dropout rate, ``attention_dropout`` the rate on the attention
    probabilities (Hugging Face's ``hidden_dropout_prob`` / ``attention_probs_dropout_prob``).
    ``position_offset`` is added to every real token's position (RoBERTa: ``pad_token_id + 1``; its pad tokens take
    position ``pad_token_id``). ``eos_token_id`` may be several ids (Llama-3-style chat models stop at any of them).

    ``pad_vocab_to`` rounds the number of rows of the vocabulary tables (token embedding, an untied LM head's kernel
    columns, a vocabulary bias) up to a multiple of itself: ``padded_vocab_size``. GPT-2's 50,257 = 29 · 1,733 rows
    divide no mesh axis, so the table and its Adam moments would be replicated on every FSDP device; with
    ``pad_vocab_to=128`` there are 50,304 = 128 · 393 rows (any power-of-two axis up to 128 splits them).
    ``vocab_size`` stays the real vocabulary (the tokenizer's, Hugging Face's ``config.json``): token ids are checked
    against it, padding rows start at zero, and their logits are masked out
    (``flaxzoo.models.layers.embeddings.mask_padded_logits``). 1: no padding.

    Decoder-family mechanisms (all off by default): ``norm_placement="sandwich"`` norms each branch's input and its
    output before the residual add (Gemma 2/3), ``"post_branch"`` only its output (OLMo 2); ``parallel_residual`` adds
    attention and feed-forward of the same input (GPT-NeoX). ``attention_out_bias`` (None: ``attention_bias``) lets
    the output projection differ from q/k/v (Qwen2: biased q/k/v, unbiased output). ``qk_norm`` RMS-normalises queries
    and keys before RoPE, per head (``"head"``: Qwen3, Gemma 3) or over all heads' features (``"full"``: OLMo 2).
    ``norm_unit_offset`` scales RMSNorms by ``1 + w`` (Gemma); ``embedding_multiplier`` multiplies the token
    embeddings (Gemma: √hidden; None: :func:`default_embedding_multiplier`, √width with sinusoidal positions).
    ``rotary_fraction`` rotates only the first ``head_dim · fraction`` features (GPT-NeoX: 0.25). ``rope_scaling`` is
    a normalised Hugging Face ``rope_scaling`` (``layers/rope_scaling.py``).
    ``sliding_window`` W lets a query see itself and the W - 1 keys before it (an encoder's, ``causal=False``: and
    the W - 1 keys after it, ``|i - j| < W``; ModernBERT's ``local_attention`` L is W = L // 2 + 1), on the layers
    ``layer_types`` marks ``"sliding_attention"`` (None: every layer, when ``sliding_window`` is set);
    ``rope_local_theta`` is those layers' RoPE θ, unscaled (Gemma 3, ModernBERT; None: they use ``rope_theta`` and
    ``rope_scaling`` as the others).
    ``attention_softcap`` / ``final_logit_softcap`` cap scores / logits at ``c · tanh(s / c)`` (Gemma 2).
    ``query_scale`` replaces the softmax scale ``1 / √head_dim`` (Gemma 2/3: ``query_pre_attn_scalar ** -0.5``).

    ``pooler_activation`` is the activation of an encoder's [CLS] pooler, ``act(dense(h[:, 0]))``: ``"tanh"`` (BERT,
    RoBERTa, ALBERT), ``"relu"`` (DistilBERT's pre-classifier), ``"gelu"`` (ELECTRA's and DeBERTa's heads), or any
    name of ``activation``. ``head_bias`` is whether that dense layer (and an MLM head's transform) has a bias
    (ModernBERT's ``classifier_bias``: False); ``decoder_bias`` whether an MLM decoder has its vocabulary bias;
    ``classifier_pooling`` what a sequence classifier pools: ``"cls"`` (the first token) or ``"mean"`` (the mean
    of the real tokens, ModernBERT's option). ``norm_bias=False`` drops the LayerNorms' bias (ModernBERT).

    ``embedding_size`` E factorises the embeddings (ALBERT, ELECTRA; Lan et al., 2020): the token, position and
    token-type tables and the embedding norm are E wide, and a linear projection (with bias) maps them to
    ``hidden_size`` before the first layer; an MLM head's transform then maps hidden → E so its decoder can be tied to
    the ``[vocab, E]`` token table. None: no projection, the tables are ``hidden_size`` wide (E == ``hidden_size``
    still gets the projection, as ALBERT has one whatever its sizes). ``shared_layers`` shares ONE block's parameters
    across all ``num_layers`` layers (ALBERT's cross-layer sharing): the block is stored once, at
    ``backbone.shared_layer``, and applied ``num_layers`` times, by a Python loop or (``scan_layers``) a ``lax.scan``
    that closes over its parameters.

    Disentangled relative attention (DeBERTa v2/v3, ``models/layers/relative_attention.py``; encoders only):
    ``relative_attention`` adds content→position / position→content scores from a table of relative-distance
    embeddings all layers share (``relative_attention_types``: a subset of ``("c2p", "p2c")``); the table spans
    ``relative_span`` distances each way: ``position_buckets`` log buckets (None: none, every distance exact) up to
    ``max_relative_positions`` (None: ``max_position_embeddings``). ``share_att_key``: the positional keys / queries
    use each layer's own key / query projections (else the layer has ``pos_key`` / ``pos_query``);
    ``relative_embedding_norm``: the table goes through a LayerNorm first (``norm_rel_ebd="layer_norm"``). The scores
    are scaled by ``1 / √(head_dim · (1 + len(relative_attention_types)))``. The terms are an additive attention bias:
    ``attention_impl`` ``"splash"`` / ``"gpu_flash"``, which take none, are refused.

    T5's relative position bias (``models/layers/relative_bias.py``): ``position_bias_buckets`` buckets of key −
    query distance (None: off), logarithmic up to ``position_bias_max_distance``, bidirectional in an encoder and
    causal in a decoder; one table per stack that every layer reads (T5, mT5), or one per layer
    (``position_bias_per_layer``: umT5). An additive bias: the Pallas kernels, which take none, are refused.

    Encoder-decoder models (``num_decoder_layers`` set: T5, BART; ``models/architectures/encoder_decoder/``): one
    config describes both stacks. ``num_layers`` is the encoder's depth and ``num_decoder_layers`` the decoder's;
    every other field holds for both (:meth:`encoder_config`, :meth:`decoder_config` give each stack's own view,
    bidirectional and causal). ``decoder_start_token_id`` is the first decoder input (T5: the pad id).
    ``scale_decoder_output`` multiplies the decoder's output by ``hidden_size ** -0.5`` before the LM head (T5
    v1.0, whose head is the token table; transformers' ``scale_decoder_outputs``). ``lm_head_bias`` gives an
    encoder-decoder's LM head a vocabulary bias (BART's ``final_logits_bias``). ``decoder_start_from_source``: a
    classifier given no decoder ids starts its decoder from each source row's last real token instead of
    ``decoder_start_token_id`` (mBART's shift, which moves the language id to the front).

    ``slot_positions``: learned / sinusoidal positions number the slots of a row, padding included (BART: a
    left-padded row's first real token sits at slot ``p`` and gets position ``p + position_offset``), rather than
    its real tokens only (the default, and RoBERTa's rule). Right-padded rows get the same positions either way;
    packed rows (``segment_ids``) still restart at each document.

    ``label_names`` are the class names of a classifier head, one per label id (``num_labels`` distinct, non-empty
    strings; Hugging Face's ``id2label``), or None: the labels are their ids.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 512
    model_type: str = "gpt2"
    causal: bool = True
    position: str = "learned"
    rope_theta: float = 10_000.0
    rope_layout: str = "half"
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    norm_placement: str = "pre"
    embedding_norm: bool = False
    final_norm: bool = True
    activation: str = "gelu_tanh"
    mlp_gated: bool = False
    attention_bias: bool = True
    mlp_bias: bool = True
    tie_word_embeddings: bool = True
    type_vocab_size: int = 0
    num_labels: int = 2
    label_names: tuple[str, ...] | None = None
    dropout: float = 0.0
    attention_dropout: float = 0.0
    position_offset: int = 0
    initializer_range: float = 0.02
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "none"
    scan_layers: bool = False
    attention_impl: str = "auto"
    pad_vocab_to: int = 1
    attention_out_bias: bool | None = None
    parallel_residual: bool = False
    qk_norm: str = "none"
    norm_unit_offset: bool = False
    embedding_multiplier: float | None = None
    rotary_fraction: float = 1.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    rope_local_theta: float | None = None
    attention_softcap: float | None = None
    final_logit_softcap: float | None = None
    query_scale: float | None = None
    pooler_activation: str = "tanh"
    relative_attention: bool = False
    relative_attention_types: tuple[str, ...] = ()
    position_buckets: int | None = None
    max_relative_positions: int | None = None
    share_att_key: bool = False
    relative_embedding_norm: bool = False
    norm_bias: bool = True
    head_bias: bool = True
    decoder_bias: bool = True
    classifier_pooling: str = "cls"
    embedding_size: int | None = None
    shared_layers: bool = False
    position_bias_buckets: int | None = None
    position_bias_max_distance: int = 128
    position_bias_per_layer: bool = False
    num_decoder_layers: int | None = None
    decoder_start_token_id: int | None = None
    scale_decoder_output: bool = False
    lm_head_bias: bool = False
    slot_positions: bool = False
    decoder_start_from_source: bool = False

    def __post_init__(self) -> None:
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.head_dim is None:
            if self.num_heads > 0 and self.hidden_size % self.num_heads != 0:
                raise FieldError(
                    "num_heads", f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}; "
                    "expected a multiple of num_heads (or pass head_dim explicitly)"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // max(self.num_heads, 1))
        if self.embedding_multiplier is None:
            object.__setattr__(self, "embedding_multiplier", default_embedding_multiplier(self))
        validate(self)


    @property
    def is_encoder_decoder(self) -> bool:
        """Whether the config describes an encoder-decoder model (``num_decoder_layers`` set)."""
        return self.num_decoder_layers is not None

    @property
    def layer_counts(self) -> int | dict[str, int]:
        """The depth of each stack, as the stacked-layer conversions take it (``layers.layer_layout.layer_count``):
        ``num_layers``, or ``{"encoder": num_layers, "decoder": num_decoder_layers}``."""
        if self.num_decoder_layers is None:
            return self.num_layers
        return {"encoder": self.num_layers, "decoder": self.num_decoder_layers}

    def encoder_config(self) -> "TransformerConfig":
        """The encoder stack's view of an encoder-decoder config: bidirectional, ``num_layers`` deep."""
        return self.replace(causal=False, num_decoder_layers=None, **_STACK_VIEW)

    def decoder_config(self) -> "TransformerConfig":
        """The decoder stack's view of an encoder-decoder config: causal, ``num_decoder_layers`` deep."""
        if self.num_decoder_layers is None:
            raise ValueError("decoder_config: this config has no decoder stack (num_decoder_layers=None)")
        return self.replace(causal=True, num_layers=self.num_decoder_layers, num_decoder_layers=None, **_STACK_VIEW)

    @property
    def embedding_width(self) -> int:
        """The width of the embedding tables: ``embedding_size``, or ``hidden_size`` when it is None."""
        return self.hidden_size if self.embedding_size is None else self.embedding_size


    @property
    def relative_max_distance(self) -> int:
        """The largest relative distance the log buckets reach: ``max_relative_positions``, else
        ``max_position_embeddings``."""
        return self.max_relative_positions or self.max_position_embeddings

    @property
    def relative_span(self) -> int:
        """Distances the relative table holds each way (it has ``2 · relative_span`` rows): ``position_buckets``,
        else ``relative_max_distance``."""
        return self.position_buckets or self.relative_max_distance

    @property
    def relative_scale_factor(self) -> int:
        """``1 +`` the number of positional score terms: the scores are divided by ``√(head_dim · factor)``."""
        return 1 + len(self.relative_attention_types)

    @property
    def rotary_dim(self) -> int:
        """The features RoPE rotates in each head: ``head_dim · rotary_fraction`` (the rest pass unrotated)."""
        return int(self.head_dim * self.rotary_fraction)

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        """Per layer, whether it attends through the sliding window."""
        if self.sliding_window is None:
            return (False,) * self.num_layers
        if self.layer_types is None:
            return (True,) * self.num_layers
        return tuple(t == "sliding_attention" for t in self.layer_types)

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        """``rope_scaling`` as a dict (None without scaling)."""
        return None if self.rope_scaling is None else dict(self.rope_scaling)


    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """``eos_token_id`` as a tuple (empty when there is none)."""
        if self.eos_token_id is None:
            return ()
        return self.eos_token_id if isinstance(self.eos_token_id, tuple) else (self.eos_token_id,)

    @property
    def padded_vocab_size(self) -> int:
        """The rows of the vocabulary tables: ``vocab_size`` rounded up to a multiple of ``pad_vocab_to``
        (``vocab_size`` itself with ``pad_vocab_to=1``); also the last dimension of the LM logits."""
        return -(-self.vocab_size // self.pad_vocab_to) * self.pad_vocab_to

    def replace(self, **changes: Any) -> "TransformerConfig":
        """A copy with ``changes`` applied (validated again).

        ``head_dim`` and ``num_kv_heads`` that hold their defaults (``hidden_size // num_heads``, ``num_heads``) are
        derived again from the new ``hidden_size`` / ``num_heads`` unless ``changes`` sets them: otherwise
        ``get_preset("gpt2-tiny", num_heads=8)`` would keep 4 KV heads of width 16 (silently grouped-query attention
        over 128 features of a 64-wide model) and an indivisible ``hidden_size`` would not be reported.
        So does an ``embedding_multiplier`` that holds its default when the positions or the width change.
        Likewise ``label_names`` that no longer fit a new ``num_labels`` (a head re-sized for another task) become
        None unless ``changes`` sets them, and a per-layer ``layer_types`` pattern follows a new ``num_layers`` (its
        first layers; repeated from the start when deeper).
        """
        if "head_dim" not in changes and ({"hidden_size", "num_heads"} & changes.keys()) and \
                self.head_dim == self.hidden_size // self.num_heads:
            changes["head_dim"] = None
        if "num_kv_heads" not in changes and "num_heads" in changes and self.num_kv_heads == self.num_heads:
            changes["num_kv_heads"] = None
        if "layer_types" not in changes and self.layer_types is not None and \
                changes.get("num_layers", self.num_layers) != self.num_layers:
            # another depth keeps the per-layer pattern: its first layers, repeated from the start when deeper
            n = changes["num_layers"]
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                changes["layer_types"] = tuple(self.layer_types[i % len(self.layer_types)] for i in range(n))
        if "embedding_multiplier" not in changes and {"position", "hidden_size", "embedding_size"} & changes.keys() \
                and self.embedding_multiplier == default_embedding_multiplier(self):
            changes["embedding_multiplier"] = None
        if "attention_out_bias" not in changes and "attention_bias" in changes and \
                self.attention_out_bias == self.attention_bias:
            changes["attention_out_bias"] = None
        if "label_names" not in changes and self.label_names is not None and \
                changes.get("num_labels", self.num_labels) != len(self.label_names):
            changes["label_names"] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TransformerConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown TransformerConfig fields {unknown}; expected a subset of {sorted(known)}")
        return cls(**values)


def default_embedding_multiplier(config: TransformerConfig) -> float:
    """The token embeddings' multiplier when ``embedding_multiplier`` is None: √(embedding width) with sinusoidal
    positions, as Vaswani et al. (2017, §3.4) scale the embeddings the waves are added to (without it the waves,
    of amplitude 1, swamp token rows initialised at ``initializer_range`` 0.02); 1.0 otherwise."""
    width = config.embedding_width
    if config.position == "sinusoidal" and isinstance(width, int) and not isinstance(width, bool) and width > 0:
        return math.sqrt(width)
    return 1.0
