"""Runs the code blocks of one documentation page in order, as ``tests/test_docs.py`` prepared them.

``python tests/docs_runner.py BLOCKS.json`` in the page's working directory. Each block is ``{"where", "lang",
"code", "env"}``: ``python`` blocks are executed in one namespace shared by the page (later blocks build on earlier
ones, as a notebook's cells do), ``bash`` blocks with ``bash -e -o pipefail``. The first failure stops the page with
the block's location (exit code 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback


def main(path: str) -> int:
    with open(path) as f:
        blocks = json.load(f)
    namespace: dict = {"__name__": "__main__"}
    for block in blocks:
        print(f"=== {block['where']} ({block['lang']}) ===", flush=True)
        start = time.perf_counter()
        saved = {k: os.environ.get(k) for k in block["env"]}
        os.environ.update(block["env"])
        try:
            if block["lang"] == "python":
                try:
                    exec(compile(block["code"], block["where"], "exec"), namespace)
                except BaseException:  # noqa: BLE001 - report any failure of the block, SystemExit included
                    traceback.print_exc()
                    print(f"FAILED: {block['where']}", flush=True)
                    return 1
            else:
                sys.stdout.flush()
                done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block["code"]])
                if done.returncode != 0:
                    print(f"FAILED: {block['where']} (exit code {done.returncode})", flush=True)
                    return 1
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        print(f"--- {block['where']}: {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
