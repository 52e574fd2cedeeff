"""Every fenced code block of ``README.md`` and ``docs/*.md`` runs as written.

How a page runs (one test per group of pages, ``page_groups()``, marker ``docs``):

- Its ```` ```python ```` and ```` ```bash ```` blocks run in document order in a fresh Python process
  (``tests/docs_runner.py``), with a working directory of its own: a new temporary folder holding a link ``configs`` to
  the repository's ``configs/`` (so ``--config configs/NAME.py`` resolves as in a clone). Python blocks share one
  namespace of the page's own: a page's blocks may build on each other, as a notebook's cells do. The pages of one
  group run one after the other in one such process (each with its own namespace and folder), so that JAX, flaxzoo
  and the programs they compile in-process (SmolLM2's load and generation) are paid for once. A bash block whose
  commands (comments aside) and environment equal those of a block an earlier page of the group passed is not run
  again: what that block created is linked into the page's folder. Bash blocks run with
  ``bash -e -o pipefail``, this environment's ``bin/`` first on ``PATH`` (``python``, ``flaxzoo``), so files one
  block writes (``runs/NAME``, a converted checkpoint) are there for the next.
- Blocks in any other language (none, ``text``, ``console``, ...) are not run.
- HTML comments on the lines right above a block's opening fence change how it runs:

  - ``<!-- docs-test: skip REASON -->``: not run; the reason is required (say what is missing: a TPU pod, a SLURM
    cluster, ...). Skips are meant to be rare: ``MAX_SKIPS`` in all.
  - ``<!-- docs-test: append ARGS -->``: ARGS are appended to every command line of the (bash) block that runs
    ``python -m flaxzoo...`` or ``flaxzoo ...`` (continuation lines joined, before a trailing ``# comment``):
    fewer steps or smaller settings for a slow command, e.g. ``--config.steps=4``. Later flags win, so a shown
    ``--rounds 3`` can be shortened by an appended ``--rounds 1``.
  - ``<!-- docs-test: env NAME=VALUE ... -->``: environment variables for that block.

  Anything else after ``docs-test:`` fails the static test below.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_LANGS = {"python", "bash"}
MAX_SKIPS = 10
PAGE_TIMEOUT_S = 900
FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")
DIRECTIVE = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
FLAXZOO_COMMAND = re.compile(r"(^|[\s;&|(])(\S*python3?\s+-m\s+flaxzoo\b|flaxzoo\s)")


@dataclasses.dataclass
class Block:
    page: pathlib.Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None = None
    append: str = ""
    env: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse_directive(text: str, block: Block) -> None:
    kind, _, rest = text.partition(" ")
    rest = rest.strip()
    if kind == "skip":
        if not rest:
            raise ValueError(f"{block.where}: docs-test: skip needs a reason")
        block.skip = rest
    elif kind == "append":
        if not rest:
            raise ValueError(f"{block.where}: docs-test: append needs arguments")
        block.append = f"{block.append} {rest}".strip()
    elif kind == "env":
        for item in shlex.split(rest):
            name, eq, value = item.partition("=")
            if not eq or not name.isidentifier():
                raise ValueError(f"{block.where}: docs-test: env expects NAME=VALUE, got {item!r}")
            block.env[name] = value
    else:
        raise ValueError(f"{block.where}: unknown directive 'docs-test: {text}' (expected skip / append / env)")


def blocks_of(page: pathlib.Path) -> list[Block]:
    """The fenced blocks of a page (every language), with the directives right above each."""
    lines = page.read_text().splitlines()
    out: list[Block] = []
    attached: set[int] = set()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and not re.match(r"^```\s*$", lines[j]):
            j += 1
        if j == len(lines):
            raise ValueError(f"{page.relative_to(ROOT)}:{start + 1}: a code block that never closes")
        block = Block(page, start + 1, m.group(1).lower(), "\n".join(lines[start + 1:j]) + "\n")
        k = start - 1
        directives = []
        while k >= 0 and DIRECTIVE.match(lines[k]):
            directives.append(DIRECTIVE.match(lines[k]).group(1))
            attached.add(k)
            k -= 1
        for text in reversed(directives):
            parse_directive(text, block)
        out.append(block)
        i = j + 1
    # A directive anywhere else is a mistake (it would silently do nothing).
    for n, line in enumerate(lines):
        if DIRECTIVE.match(line) and n not in attached:
            raise ValueError(f"{page.relative_to(ROOT)}:{n + 1}: a docs-test directive not right above a code block")
    return out


def split_comment(line: str) -> tuple[str, str]:
    """``(command, comment)``: a ``#`` that starts a word outside quotes begins the comment."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i:]
    return line.rstrip(), ""


def with_appended(code: str, args: str) -> str:
    """``code`` with ``args`` at the end of every logical line that runs ``python -m flaxzoo...`` / ``flaxzoo``."""
    if not args:
        return code
    logical, pending = [], ""
    for line in code.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    out = []
    for line in logical:
        command, comment = split_comment(line)
        if FLAXZOO_COMMAND.search(command):
            line = f"{command} {args}" + (f"  {comment}" if comment else "")
        out.append(line)
    return "\n".join(out) + "\n"


def without_comments(code: str) -> str:
    """A bash block's command lines, comments and blank lines dropped: what decides whether two blocks are the same."""
    lines = (split_comment(line)[0] for line in code.splitlines())
    return "\n".join(line for line in lines if line.strip())


def all_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks_of(page)]


def page_id(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


# Pages that run in one process, in this order (each page in its own namespace and folder): the pages whose Python
# blocks load the packaged SmolLM2, and the pages that repeat a README command (fine-tuning.md its fine-tune,
# training.md its default training run, with the same appended flags), which the runner does not run twice: it links
# README's outputs. docs/adding-a-family.md stays alone: it registers a family.
SHARED_PROCESS = ("README.md", "docs/fine-tuning.md", "docs/training.md", "docs/pretrained.md", "docs/lora-int8.md")


def page_groups() -> list[tuple[pathlib.Path, ...]]:
    """Every page once: the ``SHARED_PROCESS`` group first, then each other page alone."""
    shared = tuple(ROOT / name for name in SHARED_PROCESS)
    return [shared, *((page,) for page in PAGES if page not in shared)]


def group_id(group: tuple[pathlib.Path, ...]) -> str:
    return "+".join(page_id(page) for page in group)


# ======================================================================================================= static
def test_directives_parse_and_skips_are_rare():
    blocks = all_blocks()
    skipped = [b for b in blocks if b.skip and b.lang in RUN_LANGS]
    assert len(skipped) <= MAX_SKIPS, "skipped blocks: " + ", ".join(f"{b.where} ({b.skip})" for b in skipped)
    for b in blocks:
        if b.lang not in RUN_LANGS:
            assert not (b.skip or b.append or b.env), f"{b.where}: a directive on a {b.lang or 'plain'} block"
        if b.append:
            assert b.lang == "bash" and FLAXZOO_COMMAND.search(b.code), f"{b.where}: append on no flaxzoo command"


def test_every_page_in_one_group():
    """The groups run every page, none twice."""
    groups = page_groups()
    listed = [page for group in groups for page in group]
    assert sorted(listed) == sorted(PAGES) and len(listed) == len(set(listed)), "a page missing or run twice"


def test_append_rule():
    code = "python -m flaxzoo.train --config x   # a comment\nflaxzoo train \\\n  --config y\nls '#'\n"
    assert with_appended(code, "--config.steps=2") == (
        "python -m flaxzoo.train --config x --config.steps=2  # a comment\n"
        "flaxzoo train    --config y --config.steps=2\nls '#'\n")
    assert with_appended("python -m flaxzoo.models.io.convert a b\n", "") == "python -m flaxzoo.models.io.convert a b\n"


def test_parse_block_and_directives(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    page = tmp_path / "p.md"
    page.write_text("text\n<!-- docs-test: env A=1 B=two -->\n<!-- docs-test: append --x -->\n```bash\nflaxzoo train\n"
                    "```\n\n<!-- docs-test: skip needs a TPU pod -->\n```python\nprint(1)\n```\n```\nplain\n```\n")
    a, b, c = blocks_of(page)
    assert (a.lang, a.env, a.append, a.line) == ("bash", {"A": "1", "B": "two"}, "--x", 4)
    assert (b.lang, b.skip, b.code) == ("python", "needs a TPU pod", "print(1)\n")
    assert c.lang == "" and c.code == "plain\n"
    page.write_text("<!-- docs-test: skip -->\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="needs a reason"):
        blocks_of(page)
    page.write_text("<!-- docs-test: fast -->\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="unknown directive"):
        blocks_of(page)
    page.write_text("<!-- docs-test: skip x -->\n\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="not right above"):
        blocks_of(page)


# What a block writes: save_pretrained / save_checkpoint / save_adapters' folder, convert's DST, --workdir / --dump-hlo.
WRITES = (re.compile(r"save_(?:pretrained|checkpoint|adapters)\([^,()]+,\s*[\"']([^\"']+)[\"']"),
          re.compile(r"(?:python3?\s+-m\s+flaxzoo\.models\.io\.convert|flaxzoo\s+convert)\s+\S+\s+([^\s#]+)"),
          re.compile(r"--(?:workdir|dump-hlo)[= ]([^\s#]+)"))


def written_paths(code: str) -> list[str]:
    """The paths ``code`` writes to (comments left out)."""
    code = "\n".join(split_comment(line)[0] for line in code.splitlines())
    return [m.group(1) for pattern in WRITES for m in pattern.finditer(code)]


def ignored_folders() -> set[str]:
    """The plain folder names ``.gitignore`` ignores (``runs/``)."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return {line.strip().rstrip("/") for line in lines
            if line.strip().endswith("/") and not re.search(r"[*?\[!#]", line) and "/" not in line.strip()[:-1]}


def test_examples_write_under_ignored_folders():
    """Run from a clone, no example leaves an untracked folder in the repository: every relative path a block writes
    lies under a folder .gitignore ignores (absolute paths and URIs are the reader's own)."""
    assert written_paths('save_pretrained(m, "out_hf")\npython -m flaxzoo.models.io.convert a runs/b --to hf\n'
                         "flaxzoo train --workdir=w  # or convert a DST") == ["out_hf", "runs/b", "w"]
    ignored = ignored_folders()
    assert "runs" in ignored
    stray = [f"{b.where}: {path}" for b in all_blocks() if b.lang in RUN_LANGS for path in written_paths(b.code)
             if not (path.startswith(("/", "~")) or "://" in path or path.split("/")[0] in ignored)]
    assert not stray, f"outputs outside the ignored folders {sorted(ignored)}: {stray}"


def test_a_repeated_bash_block_runs_once_and_its_outputs_reach_the_later_page(tmp_path):
    """Two pages with the same command (other comments): it runs once; the second page's Python block reads what it
    wrote; a third page's different command runs."""
    pages = []
    for i, command in enumerate(["echo run >> ../ran && mkdir -p runs/a && echo {i} > runs/a/out  # page {i}"] * 2
                                + ["echo other >> ../ran"]):
        work = tmp_path / f"w{i}"
        work.mkdir()
        code = command.format(i=i) if i == 0 else command.format(i=0).replace("# page 0", "# shown again")
        pages.append({"page": f"p{i}", "workdir": str(work), "blocks": [
            {"where": f"p{i}:1", "lang": "bash", "env": {}, "code": code, "commands": without_comments(code)},
            {"where": f"p{i}:5", "lang": "python", "env": {}, "code": "import os\nprint('sees', os.path.exists("
             "'runs/a/out') and open('runs/a/out').read().strip())\n"}]})
    (tmp_path / "pages.json").write_text(json.dumps(pages))
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "docs_runner.py"), str(tmp_path / "pages.json")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "ran").read_text().split() == ["run", "other"]
    assert re.findall(r"^sees (\S+)", done.stdout, re.MULTILINE) == ["0", "0", "False"]  # the third page made none
    assert "p1:1: the block of p0:1, which passed; its outputs linked: runs" in done.stdout
    assert (tmp_path / "w1" / "runs").is_symlink()


# ===================================================================================================== executed
def page_spec(page: pathlib.Path, work: pathlib.Path) -> dict:
    """The runner's description of one page: its runnable blocks (directives applied) and its own working folder."""
    work.mkdir(parents=True)
    (work / "configs").symlink_to(ROOT / "configs", target_is_directory=True)
    blocks = [b for b in blocks_of(page) if b.lang in RUN_LANGS and not b.skip]
    specs = []
    for b in blocks:
        spec = {"where": b.where, "lang": b.lang, "env": b.env, "code": b.code}
        if b.lang == "bash":
            spec["code"] = with_appended(b.code, b.append)
            spec["commands"] = without_comments(spec["code"])
        specs.append(spec)
    return {"page": page_id(page), "workdir": str(work), "blocks": specs}


def run_pages(group: tuple[pathlib.Path, ...], tmp_path: pathlib.Path) -> None:
    """Run the pages of ``group`` in one runner process; fail with the first failing block's location."""
    specs = [page_spec(page, tmp_path / f"work{i}") for i, page in enumerate(group)]
    specs = [spec for spec in specs if spec["blocks"]]
    if not specs:
        pytest.skip(f"{group_id(group)} has no code block to run")
    (tmp_path / "pages.json").write_text(json.dumps(specs))
    env = dict(os.environ)
    env["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("MPLBACKEND", "Agg")
    env["PYTHONUNBUFFERED"] = "1"
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "docs_runner.py"), str(tmp_path / "pages.json")],
                          cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=PAGE_TIMEOUT_S * len(specs))
    print(done.stdout[-20000:])
    if done.returncode != 0:
        failed = re.findall(r"^FAILED: (.*)$", done.stdout, re.MULTILINE)
        pytest.fail(f"{group_id(group)}: {failed[-1] if failed else 'the runner failed'}\n{done.stdout[-12000:]}",
                    pytrace=False)
    passed = re.findall(r"^PASSED: (\S+)", done.stdout, re.MULTILINE)
    assert passed == [spec["page"] for spec in specs], f"pages that ran whole: {passed}"


@pytest.mark.docs
@pytest.mark.timeout(PAGE_TIMEOUT_S * len(SHARED_PROCESS) + 60)
@pytest.mark.parametrize("group", page_groups(), ids=group_id)
def test_code_blocks_run(group, tmp_path):
    run_pages(group, tmp_path)
