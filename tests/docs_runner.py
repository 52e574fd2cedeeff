"""Runs the code blocks of one or more documentation pages, as ``tests/test_docs.py`` prepared them.

``python tests/docs_runner.py PAGES.json``. The file lists pages ``{"page", "workdir", "blocks"}``, run one after
the other in this one process (JAX, flaxzoo and the programs they compiled are imported / traced once for all of
them), each page as if alone: a fresh namespace (``__name__ == "__main__"``) and its own working directory. Each block
is ``{"where", "lang", "code", "env"}``: ``python`` blocks are executed in the page's namespace (later blocks build on
earlier ones, as a notebook's cells do), ``bash`` blocks with ``bash -e -o pipefail`` in the page's directory. The
first failure stops the run with the block's location (exit code 1); ``PASSED: PAGE`` marks each page that ran whole.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback

from flaxzoo.models.jax_startup import fewer_gc_passes


def run_block(block: dict, namespace: dict) -> bool:
    """Run one block with its environment variables set for it alone; False (after saying why) when it failed."""
    saved = {k: os.environ.get(k) for k in block["env"]}
    os.environ.update(block["env"])
    try:
        if block["lang"] == "python":
            try:
                exec(compile(block["code"], block["where"], "exec"), namespace)
            except BaseException:  # noqa: BLE001 - report any failure of the block, SystemExit included
                traceback.print_exc()
                print(f"FAILED: {block['where']}", flush=True)
                return False
        else:
            sys.stdout.flush()
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block["code"]])
            if done.returncode != 0:
                print(f"FAILED: {block['where']} (exit code {done.returncode})", flush=True)
                return False
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return True


def run_page(page: dict) -> bool:
    """The blocks of one page in order, in its own namespace and working directory."""
    namespace: dict = {"__name__": "__main__"}
    os.chdir(page["workdir"])
    page_start = time.perf_counter()
    for block in page["blocks"]:
        print(f"=== {block['where']} ({block['lang']}) ===", flush=True)
        start = time.perf_counter()
        if not run_block(block, namespace):
            return False
        print(f"--- {block['where']}: {time.perf_counter() - start:.1f} s", flush=True)
    print(f"PASSED: {page['page']} ({time.perf_counter() - page_start:.1f} s)", flush=True)
    return True


def main(path: str) -> int:
    fewer_gc_passes()  # as the tests' own processes (tests/conftest.py)
    with open(path) as f:
        pages = json.load(f)
    return 0 if all(run_page(page) for page in pages) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
