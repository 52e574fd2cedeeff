"""``python -m flaxzoo.train.bench ...``: the benchmark, which lives in ``flaxzoo.train.tools.bench`` (``--help``
lists its flags)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("flaxzoo.train.tools.bench", run_name="__main__", alter_sys=True)
