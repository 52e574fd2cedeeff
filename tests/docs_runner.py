"""Runs the code blocks of one or more documentation pages, as ``tests/test_docs.py`` prepared them.

``python tests/docs_runner.py PAGES.json``. The file lists pages ``{"page", "workdir", "blocks"}``, run one after
the other in this one process (JAX, flaxzoo and the programs they compiled are imported / traced once for all of
them), each page as if alone: a fresh namespace (``__name__ == "__main__"``) and its own working directory. Each block
is ``{"where", "lang", "code", "env"}``, bash blocks also ``"commands"`` (the code without its comments): ``python``
blocks are executed in the page's namespace (later blocks build on earlier ones, as a notebook's cells do), ``bash``
blocks with ``bash -e -o pipefail`` in the page's directory. The first failure stops the run with the block's location
(exit code 1); ``PASSED: PAGE`` marks each page that ran whole.

A bash block whose commands and environment equal those of a block an earlier page of the run passed is not run
again: the files and folders that block created in its page's folder are linked into this page's folder instead, so
the page's later blocks read the same outputs (``docs/fine-tuning.md`` shows README's fine-tune command, ~20 s). A
block that created nothing new runs again.
"""

from __future__ import annotations

import json
import os
import pathlib
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


def paths_under(folder: str) -> set[str]:
    """Every file and folder below ``folder``, relative to it; symbolic links are listed, not followed."""
    found = set()
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            found.add(os.path.relpath(os.path.join(root, name), folder))
    return found


def created(before: set[str], after: set[str]) -> list[str]:
    """The topmost of the paths in ``after`` but not ``before`` (a new folder stands for everything inside it)."""
    new = after - before
    return sorted(p for p in new if os.path.dirname(p) not in new)


def link_outputs(source: str, outputs: list[str], target: str) -> None:
    for path in outputs:
        pathlib.Path(target, path).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.join(source, path), os.path.join(target, path))


# (commands, environment) of each bash block that passed -> (where it ran, its page's folder, what it created there)
PASSED_BASH: dict[tuple[str, str], tuple[str, str, list[str]]] = {}


def run_page(page: dict) -> bool:
    """The blocks of one page in order, in its own namespace and working directory."""
    namespace: dict = {"__name__": "__main__"}
    os.chdir(page["workdir"])
    page_start = time.perf_counter()
    for block in page["blocks"]:
        print(f"=== {block['where']} ({block['lang']}) ===", flush=True)
        key = (block.get("commands", block["code"]), json.dumps(block["env"], sort_keys=True))
        if block["lang"] == "bash" and key in PASSED_BASH and PASSED_BASH[key][2]:
            where, source, outputs = PASSED_BASH[key]
            link_outputs(source, outputs, page["workdir"])
            print(f"--- {block['where']}: the block of {where}, which passed; its outputs linked: "
                  f"{', '.join(outputs)}", flush=True)
            continue
        start = time.perf_counter()
        before = paths_under(page["workdir"]) if block["lang"] == "bash" else set()
        if not run_block(block, namespace):
            return False
        if block["lang"] == "bash":
            outputs = created(before, paths_under(page["workdir"]))
            PASSED_BASH.setdefault(key, (block["where"], page["workdir"], outputs))
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
