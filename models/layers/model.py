"""What every model class shares: a config, a ``TransformerStack`` at ``backbone`` made of the class's ``block``, and
the stack's final states. A family's classes add their heads beside the backbone (``architectures/encoder/model.py``,
``architectures/decoder/model.py``)."""

from __future__ import annotations

import jax
from flax import nnx

from flaxzoo.models.config import TransformerConfig
from flaxzoo.models.layers.block import TransformerBlock
from flaxzoo.models.layers.stack import TransformerStack


class StackModel(nnx.Module):
    """A model built around one ``TransformerStack`` (``self.backbone``).

    Class attributes a subclass sets: ``task`` (``"base"``, ``"causal_lm"``, ``"masked_lm"``,
    ``"sequence_classification"``, ``"token_classification"``: what the family registry looks classes up by),
    ``causal`` (the kind of config it takes: a decoder's or an encoder's; another is a ValueError) and ``block`` (the
    layer its stack is made of).
    """

    task = "base"
    causal = True
    block = TransformerBlock

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        if config.causal != self.causal:
            kind = "a decoder" if self.causal else "an encoder"
            raise ValueError(f"{type(self).__name__} needs {kind} config (causal={self.causal}); got "
                             f"causal={config.causal}")
        self.config = config
        self.backbone = TransformerStack(config, rngs=rngs, block=self.block)

    def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                      token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, *,
                      segment_ids: jax.Array | None = None) -> jax.Array:
        """The stack's final states ``[batch, seq, hidden]`` for ``[batch, seq]`` ids, before any head (a loss can
        project them in chunks with the class's ``logits`` and never hold ``[batch, seq, vocab]``)."""
        return self.backbone(input_ids, attention_mask, token_type_ids, position_ids, segment_ids=segment_ids).hidden


class LanguageModel(StackModel):
    """A stack and a head over every position's states: ``model(ids)`` is ``logits(hidden_states(ids))``, so a loss
    can take :meth:`hidden_states` and project only the positions it scores (subclasses define :meth:`logits`)."""

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, position_ids: jax.Array | None = None, *,
                 segment_ids: jax.Array | None = None) -> jax.Array:
        """``[batch, seq]`` ids → logits ``[batch, seq, vocab]`` (the compute dtype, ``config.dtype``)."""
        return self.logits(self.hidden_states(input_ids, attention_mask, token_type_ids, position_ids,
                                              segment_ids=segment_ids))

    def logits(self, hidden: jax.Array) -> jax.Array:
        """The head alone: ``[batch, n, hidden]`` states → ``[batch, n, vocab]`` logits (the compute dtype)."""
        raise NotImplementedError(f"{type(self).__name__} defines no logits")
