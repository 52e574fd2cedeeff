"""Everything that reads or writes a file: pretrained weights in and out (``from_pretrained`` / ``save_pretrained``),
GGUF, flaxzoo checkpoints, conversion, tokenizers and chat templates.

``from_pretrained`` is the one entry point for every source: a Hugging Face model directory, a GGUF file (llama.cpp;
read by ``models/io/gguf.py``), a flaxzoo training checkpoint (``models/io/checkpoint.py``), a packaged model's name or a
Hugging Face Hub id. ``save_pretrained`` writes Hugging Face directories. The package:

* the families themselves (name tables, config translation, GGUF names) and their table machinery live in
  ``flaxzoo.models.families`` (one folder per family, one registration line each);
* ``files.py``: all file and network I/O (safetensors / index / pickle reading, packaged names and Hub downloads,
  writing);
* ``sources.py``: one object per format (``describe`` / ``read`` / ``plan`` / ``fingerprint``) and ``open_source``,
  the one place that tells the formats apart;
* ``sharded.py`` (with ``sharded_plan.py`` and ``sharded_workdir.py``): the one loader every source takes, onto a
  mesh's shards or the default device (one check of names and shapes, float or int8); ``load_adapted``;
* ``pretrained.py``: ``from_pretrained`` / ``save_pretrained`` themselves;
* ``gguf.py`` / ``gguf_tokenizers.py`` (llama.cpp files), ``checkpoint.py`` (a training run's weights),
  ``convert.py`` (``flaxzoo convert``), ``tokenizer.py``, ``chat.py`` / ``chat_render.py`` (chat templates).
"""

from flaxzoo.models.io.files import HUB_ALLOW_PATTERNS, download_from_hub, is_hub_id, resolve_pretrained
from flaxzoo.models.io.pretrained import from_pretrained, save_pretrained
from flaxzoo.models.io.sharded import load_adapted
from flaxzoo.models.io.sources import open_source

__all__ = ["HUB_ALLOW_PATTERNS", "download_from_hub", "from_pretrained", "is_hub_id", "load_adapted", "open_source",
           "resolve_pretrained", "save_pretrained"]
