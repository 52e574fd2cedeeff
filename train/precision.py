"""The precision rules of training, one set for every task (pre-training, fine-tuning).

- **Compute dtype**: float32 or bfloat16. bfloat16 keeps float32's exponent range, so its gradients need no loss
  scaling. float16 is refused: without dynamic loss scaling its small gradients flush to zero and its large
  activations overflow (Adam's first update from float16 gradients is ``[nan, inf, ...]``), and flaxzoo has none.
- **Parameter dtype**: float32. The parameters the optimizer updates are the master weights, and Adam's moments take
  their dtype: bfloat16 parameters would hold bfloat16 moments and lose updates smaller than 2⁻⁸ of a weight. Mixed
  precision is float32 parameters with ``compute_dtype="bfloat16"`` (the matmuls run in bfloat16, the master copy and
  the optimizer state stay float32). Frozen weights that nothing updates may be lower precision (LoRA's
  ``lora.base_dtype``).
"""

from __future__ import annotations

TRAINING_COMPUTE_DTYPES = ("float32", "bfloat16")
TRAINING_PARAM_DTYPES = ("float32",)


def training_precision_error(compute_dtype: str, param_dtype: str = "float32") -> tuple[str, str] | None:
    """``(which, message)`` when ``compute_dtype`` / ``param_dtype`` break the rules above (``which`` is
    ``"compute_dtype"`` or ``"param_dtype"``), else None. ``"auto"`` compute (bfloat16 or float32) passes."""
    if compute_dtype not in (*TRAINING_COMPUTE_DTYPES, "auto"):
        return "compute_dtype", (f"{compute_dtype!r} is refused for training: float16 needs dynamic loss scaling, "
                                 "which flaxzoo does not have (its gradients underflow and Adam's first update is "
                                 "NaN / Inf); expected 'bfloat16' (float32's exponent range, no scaling needed), "
                                 "'float32' or 'auto'")
    if param_dtype not in TRAINING_PARAM_DTYPES:
        return "param_dtype", (f"{param_dtype!r} is refused for training: the trained parameters are the master "
                               "weights and Adam's moments take their dtype, so they must be float32; expected "
                               "'float32' (with compute_dtype='bfloat16' for mixed precision: bfloat16 matmuls, "
                               "float32 master weights and optimizer state)")
    return None
