"""Pretrained weights in and out: ``from_pretrained`` / ``save_pretrained``.

``from_pretrained`` is the one entry point for every source: a Hugging Face model directory, a GGUF file (llama.cpp;
read by ``models/gguf.py``), a flaxzoo training checkpoint (``models/checkpoint.py``) or a Hugging Face Hub id.
``save_pretrained`` writes Hugging Face directories. The package:

* ``mapping.py``: the table machinery (``Transform`` / ``layout``, ``Entry``, ``WeightMap``, ``Family``) and the
  strict matching of a checkpoint's tensors against a table;
* ``fields.py``: ``config.json`` fields every family translates alike (activations, special ids, labels);
* one module per family, each defining ``FAMILY`` (its name table and config translation): ``bert.py``,
  ``roberta.py``, ``gpt2.py``, ``llama.py`` (with llama.cpp's GGUF names, ``GGUF_LLAMA_NAMES``);
* ``registry.py``: the families, one line each (adding a family: its module, and its line there);
* ``files.py``: all file and network I/O (safetensors / index / pickle reading, Hub downloads, writing);
* ``pretrained.py``: ``from_pretrained`` / ``save_pretrained`` themselves.
"""

from flaxzoo.models.hub.files import (HUB_ALLOW_PATTERNS, checkpoint_kind, download_from_hub, is_hub_id,
                              resolve_pretrained)
from flaxzoo.models.hub.llama import GGUF_LLAMA_NAMES, gguf_name
from flaxzoo.models.hub.mapping import Entry, Family, Transform, WeightMap, layout
from flaxzoo.models.hub.pretrained import from_pretrained, save_pretrained
from flaxzoo.models.hub.registry import FAMILIES, SUPPORTED_ARCHITECTURES

__all__ = ["FAMILIES", "GGUF_LLAMA_NAMES", "HUB_ALLOW_PATTERNS", "SUPPORTED_ARCHITECTURES", "Entry", "Family",
           "Transform", "WeightMap", "checkpoint_kind", "download_from_hub", "from_pretrained", "gguf_name",
           "is_hub_id", "layout", "resolve_pretrained", "save_pretrained"]
