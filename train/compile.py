"""``python -m flaxzoo.train.compile ...``: a config's step compiled for a TPU / GPU target, which lives in
``flaxzoo.train.tools.compile`` (``--help`` lists its flags and exit codes)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("flaxzoo.train.tools.compile", run_name="__main__", alter_sys=True)
