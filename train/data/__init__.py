"""The input pipeline: corpus -> TFDS builders (array_record) -> tokenizer -> packing (segment ids) -> masking ->
Grain loader. Everything runs without TensorFlow.

One module per job:

- :mod:`~flaxzoo.train.data.config`: :class:`DataConfig`, the settings.
- :mod:`~flaxzoo.train.data.corpus`: the embedded corpus (Python's own documentation), text / JSONL files, document and
  sentence splitting.
- :mod:`~flaxzoo.train.data.builders`: the TFDS builders, cache keys, the preparation lock; :func:`raw_sources`.
- :mod:`~flaxzoo.train.data.tokenizers`: :func:`build_tokenizer` from a ``DataConfig`` (trained and cached, or loaded).
- :mod:`~flaxzoo.train.data.packing`: fixed-length records with per-token document numbers; :func:`prepare`.
- :mod:`~flaxzoo.train.data.masking`: BERT masking, vectorised, counter-based randomness per example.
- :mod:`~flaxzoo.train.data.loader`: :class:`BatchSource`, :func:`make_loader`, :func:`make_iterator`, :func:`batch_shapes`.
- :mod:`~flaxzoo.train.data.stats`: throughput, corpus sizes, the unigram baseline, the ``python -m flaxzoo.train.data`` command line.

Stages are cached under ``DataConfig.data_dir``, so a second run reuses the first one's work. The batch layout is
the contract of :mod:`flaxzoo.train.batches` (``IGNORE_INDEX``, ``CAUSAL_KEYS``, ``MLM_KEYS``).
"""

from flaxzoo.models.jax_startup import quiet_jax_startup

quiet_jax_startup()  # before anything imports JAX: no CUDA plugin / libtpu start-up noise on a CPU machine

from flaxzoo.train.batches import CAUSAL_KEYS, IGNORE_INDEX, MLM_KEYS  # noqa: E402
from flaxzoo.train.data.builders import RawCorpus, cache_key, load_documents, raw_sources  # noqa: E402
from flaxzoo.train.data.config import MIN_SEQ_LEN, OBJECTIVES, DataConfig, default_data_dir  # noqa: E402
from flaxzoo.train.data.corpus import (  # noqa: E402
    TextFiles,
    decode_bytes,
    embedded_documents,
    read_text_files,
    resolve_paths,
    split_documents,
    split_sentences,
)
from flaxzoo.train.data.loader import BatchIterator, BatchSource, batch_shapes, make_iterator, make_loader  # noqa: E402
from flaxzoo.train.data.masking import example_keys, mask_tokens  # noqa: E402
from flaxzoo.train.data.packing import PACK_FORMAT_VERSION, pack_causal, pack_mlm, prepare  # noqa: E402
from flaxzoo.train.data.stats import corpus_stats, main, measure_throughput, unigram_baseline  # noqa: E402
from flaxzoo.train.data.tokenizers import build_tokenizer, check_tokenizer  # noqa: E402
from flaxzoo.train.tokenizer import TextTokenizer  # noqa: E402

__all__ = [
    "BatchIterator", "BatchSource", "CAUSAL_KEYS", "DataConfig", "IGNORE_INDEX", "MIN_SEQ_LEN", "MLM_KEYS",
    "OBJECTIVES", "PACK_FORMAT_VERSION", "RawCorpus", "TextFiles", "TextTokenizer", "batch_shapes", "build_tokenizer",
    "cache_key", "check_tokenizer", "corpus_stats", "decode_bytes", "default_data_dir", "embedded_documents",
    "example_keys", "load_documents", "main", "make_iterator", "make_loader", "mask_tokens", "measure_throughput",
    "pack_causal", "pack_mlm", "prepare", "raw_sources", "read_text_files", "resolve_paths", "split_documents",
    "split_sentences", "unigram_baseline",
]
