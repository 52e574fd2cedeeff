"""flaxzoo's training engine and its tasks (pre-training, fine-tuning); ``flaxzoo.train.tools`` holds what stands
apart from the engine (benchmarks, compile reports, GPU checks)."""

import importlib.abc
import sys

# Modules that moved out of the engine into tools/ (and names that now say what a module is): importing an old name
# fails in one line that names the new one. ``flaxzoo.train.bench`` and ``flaxzoo.train.compile`` still run as
# commands (they forward to their tools).
MOVED_MODULES = {
    **{name: f"tools.{name}" for name in (
        "gpu_check", "gpu_encoder_check", "gpu_window_check", "roofline", "hlo", "targets", "notebook")},
    "finetune.compile": "tools.compile_finetune",
    "loop": "pretrain",  # the pre-training task (the loop itself is flaxzoo.train.engine)
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Consulted after the ordinary finders (appended to ``sys.meta_path``): only names no file answers reach it."""

    def find_spec(self, fullname, path=None, target=None):
        prefix = __name__ + "."
        if fullname.startswith(prefix):
            name = fullname[len(prefix):]
            for old, new in MOVED_MODULES.items():
                if name == old or name.startswith(old + "."):
                    moved = prefix + new + name[len(old):]
                    raise ModuleNotFoundError(f"{fullname} has moved: import {moved}", name=fullname)
        return None


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())
