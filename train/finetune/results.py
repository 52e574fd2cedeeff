"""The fine-tuning tables of the README, measured: ``python -m flaxzoo.train.finetune.results bbc|positions [--seeds 0,1]``.

- ``bbc``: on the BBC headline split of each seed (``data.split_seed`` = ``seed``): the reference points of
  ``baselines.py`` (TF-IDF + linear SVM, frozen MiniLM + logistic regression, a plain transformers + PyTorch loop),
  a plain full fine-tune (every practice off), the recipe (``configs/finetune_cls.py``) and the recipe minus each
  practice; macro-F1, accuracy and wall seconds (from loading the model to the end of the test predictions) for each.
- ``positions``: ``configs/headlines_from_scratch.py`` with each position scheme and three seeds (default 0, 1, 2):
  mean ± standard deviation and the range of macro-F1.

Fine-tunes run in this process one after another (JAX's persistent compilation cache is warm after the first run of
a shape; ``--cold`` points it at a fresh directory first). Every row records the host. Markdown goes to stdout,
the rows as JSON lines to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import pathlib
import statistics
import sys
import tempfile
from typing import Any, Sequence

from flaxzoo.models.jax_startup import quiet_jax_startup

quiet_jax_startup()  # before anything imports JAX: no CUDA plugin / libtpu start-up noise on a CPU machine

from flaxzoo.train.config import ConfigError  # noqa: E402
from flaxzoo.train.finetune.config import FinetuneConfig  # noqa: E402
from flaxzoo.train.finetune.trainer import Finetuner  # noqa: E402

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
# The recipe minus one practice each: the config changes that switch it off.
ABLATIONS: dict[str, dict[str, Any]] = {
    "recipe": {},
    "recipe - vocabulary extension": {"vocab.frequent": False},
    "recipe - head+tail truncation": {"data.truncation": "head"},
    "recipe - layer-wise LR decay": {"optim.layer_decay": 1.0},
    "recipe - gradient clipping": {"optim.grad_clip": 0.0},
    "recipe - head first (freeze)": {"freeze_steps": 0, "head_lr": 0.0},
}
# Every practice off, with the plain PyTorch loop's settings (baselines.py: AdamW lr 5e-5, weight decay 0.01, 10%
# warmup then linear decay, batch 32, max length 48, 8 epochs). Not identical work: flaxzoo's AdamW does not decay
# biases, norms and embeddings (torch.optim.AdamW decays every parameter), and batches are grouped by length.
PLAIN = {"vocab.frequent": False, "data.truncation": "head", "optim.layer_decay": 1.0, "optim.grad_clip": 0.0,
         "freeze_steps": 0, "head_lr": 0.0, "optim.lr": 5e-5, "data.max_len": 48}
POSITIONS = ("learned", "sinusoidal", "rope", "alibi")


def load_config(name: str):
    spec = importlib.util.spec_from_file_location(f"finetune_config_{name}", CONFIGS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def apply(config, changes: dict[str, Any]):
    for key, value in changes.items():
        node = config
        *parents, leaf = key.split(".")
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    return config


def finetune_row(name: str, config_name: str, changes: dict[str, Any], seed: int, root: pathlib.Path,
                 quiet: bool = True) -> dict[str, Any]:
    """One fine-tune of ``config_name`` with ``changes`` at ``seed`` (training seed and split seed)."""
    config = apply(load_config(config_name), {**changes, "seed": seed, "data.split_seed": seed})
    cfg = FinetuneConfig.from_config_dict(config)
    workdir = root / f"{name.replace(' ', '_').replace('+', '')}_{seed}"
    with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
        summary = Finetuner(cfg, workdir).run()
    m = summary.metrics
    return {"method": name, "seed": seed, "macro_f1": m["macro_f1"], "accuracy": m["accuracy"],
            "wall_s": m["wall_s"], "train_s": m["train_s"], "steps": m["steps"], "workdir": str(workdir)}


def bbc_rows(seeds: Sequence[int], root: pathlib.Path, include_baselines: bool = True,
             methods: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The rows of the BBC table (``methods``: only these: "tfidf", "frozen", "plain", the ablation names, "torch";
    None: all)."""
    from flaxzoo.train.finetune import baselines
    from flaxzoo.train.finetune.config import ClassifyDataConfig
    from flaxzoo.train.finetune.data import load_labelled

    rows = []
    wanted = lambda name: methods is None or name in methods  # noqa: E731
    for seed in seeds:
        split = load_labelled(ClassifyDataConfig.from_values({"split_seed": seed}))
        if include_baselines and wanted("tfidf"):
            rows.append({**baselines.tfidf_baseline(split), "seed": seed})
        if include_baselines and wanted("frozen"):
            rows.append({**baselines.frozen_encoder_baseline(split), "seed": seed})
        if wanted("plain"):
            rows.append(finetune_row("plain full fine-tune", "finetune_cls", PLAIN, seed, root))
        for name, changes in ABLATIONS.items():
            if not wanted(name):
                continue
            rows.append(finetune_row(name, "finetune_cls", changes, seed, root))
            print(f"  {name} (seed {seed}): macro-F1 {rows[-1]['macro_f1']:.4f}, {rows[-1]['wall_s']:.0f} s",
                  file=sys.stderr, flush=True)
        if include_baselines and wanted("torch"):
            rows.append({**baselines.torch_finetune_baseline(split, seed), "seed": seed})
    return rows


def positions_rows(seeds: Sequence[int], root: pathlib.Path) -> list[dict[str, Any]]:
    rows = []
    for position in POSITIONS:
        for seed in seeds:
            rows.append({**finetune_row(f"from scratch, {position}", "headlines_from_scratch",
                                        {"model.position": position}, seed, root), "position": position})
            print(f"  {position} (seed {seed}): macro-F1 {rows[-1]['macro_f1']:.4f}", file=sys.stderr, flush=True)
    return rows


def bbc_table(rows: Sequence[dict[str, Any]]) -> str:
    seeds = sorted({r["seed"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    head = "| method | " + " | ".join(f"macro-F1 (seed {s}) | wall s (seed {s})" for s in seeds) + " |"
    lines = [head, "|---|" + "---:|---:|" * len(seeds)]
    for method in methods:
        cells = []
        for s in seeds:
            r = next((r for r in rows if r["method"] == method and r["seed"] == s), None)
            cells += [f"{r['macro_f1']:.3f}", f"{r['wall_s']:.0f}"] if r else ["", ""]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def positions_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| position | macro-F1 mean ± std | range | seeds |", "|---|---:|---:|---:|"]
    for position in POSITIONS:
        f1 = [r["macro_f1"] for r in rows if r.get("position") == position]
        if f1:
            spread = statistics.stdev(f1) if len(f1) > 1 else 0.0
            lines.append(f"| {position} | {statistics.mean(f1):.3f} ± {spread:.3f} | {min(f1):.3f}–{max(f1):.3f} "
                         f"| {len(f1)} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flaxzoo.train.finetune.results", description=__doc__.split("\n\n")[0])
    parser.add_argument("table", choices=["bbc", "positions"])
    parser.add_argument("--seeds", default=None, help="comma-separated (bbc: 0,1; positions: 0,1,2)")
    parser.add_argument("--no-baselines", action="store_true", help="bbc: the fine-tunes only")
    parser.add_argument("--methods", default=None,
                        help="bbc: a comma-separated subset of the rows: 'tfidf', 'frozen', 'plain', 'recipe', "
                             "'recipe - ...', 'torch' (default: all)")
    parser.add_argument("--out", default=None, help="JSON lines of the rows")
    parser.add_argument("--workdir", default=None, help="where the runs go (default: a temporary directory)")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in (args.seeds or ("0,1" if args.table == "bbc" else "0,1,2")).split(",")]
    from flaxzoo.train.finetune.baselines import host_info

    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(args.workdir or tmp)
        try:
            methods = [m.strip() for m in args.methods.split(",")] if args.methods else None
            rows = (bbc_rows(seeds, root, not args.no_baselines, methods) if args.table == "bbc"
                    else positions_rows(seeds, root))
        except ConfigError as exc:
            print(f"config error: {exc}", file=sys.stderr)
            return 2
    host = host_info()
    if args.out:
        with open(args.out, "w") as fh:
            for row in rows:
                fh.write(json.dumps({**{k: v for k, v in row.items() if k != "test_predictions"}, "host": host}) + "\n")
    print(f"host: {host}")
    print(bbc_table(rows) if args.table == "bbc" else positions_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
