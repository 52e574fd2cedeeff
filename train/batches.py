"""What a training batch holds: the contract between the input pipeline (``flaxzoo.train.data``) and the steps
(``flaxzoo.train.step``). Plain constants only, so the benchmark can build batches without importing the data stack.

Every array is ``[rows, seq]`` int32 unless stated, rows = this process's share of the global batch.

Causal LM (``CAUSAL_KEYS``):
    ``input_ids``; ``targets`` (the next token, ``IGNORE_INDEX`` where nothing is scored: padding rows, a document's
    last position in a packed row); ``segment_ids`` (documents numbered from 1 within a row, 0 = padding).
Masked LM (``MLM_KEYS``):
    ``input_ids`` (after masking); ``attention_mask`` (1 = real token); ``token_type_ids``; ``segment_ids``;
    ``labels`` (the original id at masked positions, ``IGNORE_INDEX`` elsewhere); ``masked_positions``
    ``[rows, max_predictions]`` (where the scored positions are, padding slots 0) and ``masked_labels``
    ``[rows, max_predictions]`` (their original ids, ``IGNORE_INDEX`` in padding slots). The loss gathers the
    hidden states at ``masked_positions`` before the vocabulary head, as BERT's pre-training does.
"""

IGNORE_INDEX = -100  # a label / target that is not scored (PyTorch's and transformers' convention)
CAUSAL_KEYS = ("input_ids", "targets", "segment_ids")
MLM_KEYS = ("input_ids", "attention_mask", "token_type_ids", "segment_ids", "labels", "masked_positions",
            "masked_labels")
