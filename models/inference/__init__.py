"""Running a model: text generation (``generate``, ``sampling``, ``text``), sentence embeddings and search
(``sentence``, ``sentence_encoder``), labels and probabilities (``classifier``), unpadding by packing (``packing``)."""
