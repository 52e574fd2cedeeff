"""``python -m flaxzoo.train [--config configs/NAME.py] [--config.KEY=VALUE ...] [--workdir DIR]``

Trains the model of the config on every device there is (a mesh from ``mesh.*``), resuming from ``WORKDIR``'s latest
checkpoint when there is one. With no arguments: the tiny GPT of ``configs/default.py`` on the embedded corpus, into
``runs/default``. ``--config`` also takes a bare name from ``configs/`` (``--config bert_tiny``).

Exit codes (``flaxzoo.train.exit_codes``, the same for every task): 0 finished, 1 the run failed (a non-finite loss, no
usable checkpoint, any error after the first training step), 2 a bad config, command line or input found before
training (nothing was computed), 75 stopped by SIGTERM / SIGINT / preemption before the last step, after saving its
checkpoint: run the same command again to resume.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import logging
import pathlib
import re
import sys
import time
from typing import TYPE_CHECKING, Any

_START = time.perf_counter()

from flaxzoo.models.jax_startup import fewer_gc_passes, quiet_jax_startup  # noqa: E402

quiet_jax_startup()  # before anything imports JAX: no CUDA plugin / libtpu start-up noise on a CPU machine

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from flaxzoo import configs  # noqa: E402
from flaxzoo.train import exit_codes  # noqa: E402

if TYPE_CHECKING:
    from flaxzoo.train.pretrain import Summary

CONFIG_DIR = pathlib.Path(configs.__file__).resolve().parent
DEFAULT_CONFIG = CONFIG_DIR / "default.py"


def available_configs() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.py") if not p.stem.startswith("_"))


def resolve_config_argument(argv: list[str]) -> tuple[list[str], str | None]:
    """Accept ``--config NAME`` for ``configs/NAME.py``; return (argv, error message or None)."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--config" and i + 1 < len(out):
            index, value = i + 1, out[i + 1]
        elif arg.startswith("--config="):
            index, value = i, arg.split("=", 1)[1]
        else:
            continue
        path, _, suffix = value.partition(":")
        if pathlib.Path(path).is_file():
            return out, None
        candidate = CONFIG_DIR / (path if path.endswith(".py") else f"{path}.py")
        if not candidate.is_file():
            candidate = CONFIG_DIR / pathlib.Path(path).name
        if candidate.is_file():
            resolved = str(candidate) + (f":{suffix}" if suffix else "")
            out[index] = resolved if index == i + 1 else f"--config={resolved}"
            return out, None
        return out, f"--config {value}: no such config file; expected a path or one of {available_configs()}"
    return out, None


def _config_name(argv: list[str]) -> str:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return pathlib.Path(argv[i + 1].split(":")[0]).stem
        if arg.startswith("--config="):
            return pathlib.Path(arg.split("=", 1)[1].split(":")[0]).stem
    return "default"


@functools.lru_cache(maxsize=4)
def _load_config(config_path: str) -> Any:
    """The ConfigDict of the config file (``configs/NAME.py``), or None if it cannot be read."""
    try:
        spec = importlib.util.spec_from_file_location("flaxzoo_config_file", config_path.split(":")[0])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.get_config()
    except Exception:  # noqa: BLE001 - only a better message is lost
        return None


def _config_keys(config_path: str, dotted: str) -> list[str] | None:
    """The keys of the config (``configs/NAME.py``) at ``dotted`` (``""``: the top level), or None if it cannot be
    read or is no section."""
    try:
        node = _load_config(config_path)
        for part in filter(None, dotted.split(".")):
            node = node[part]
        return sorted(node.keys())
    except Exception:  # noqa: BLE001 - only a better message is lost
        return None


def _nearest_path(config_path: str, known: list[str], rest: list[str]) -> str:
    """``known`` (a path the config has) followed by as much of ``rest`` as exists there, each unknown key replaced
    by its closest spelling: ``optim`` + ``lr`` gives ``optim.lr``, ``optim`` + ``nope`` gives ``optim``."""
    path = list(known)
    for part in rest:
        keys = _config_keys(config_path, ".".join(path))
        if keys is None:
            break
        close = [part] if part in keys else difflib.get_close_matches(part, keys, 1)
        if not close:
            break
        path.append(close[0])
    return ".".join(path)


def config_key_error(exc: BaseException, argv: list[str], config_path: str) -> str:
    """One line for a ``--config.KEY=VALUE`` that names no key: the flag, the first missing key and the closest valid
    path (ml_collections' own suggestion, else a section holding that key, else the nearest spelling at that level,
    the rest of the path completed the same way) or the valid keys at that level."""
    chain, cause = [], exc
    while cause is not None and len(chain) < 10:
        chain.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    text = " ".join(chain)
    suggestion = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text)
    missing = suggestion.group(2) if suggestion else next(iter(re.findall(r"'([A-Za-z0-9_]+)'", text)), None)
    for arg in argv[1:]:
        if not arg.startswith("--config."):
            continue
        dotted = arg[len("--config."):].split("=", 1)[0]
        parts = dotted.split(".")
        if missing not in parts:
            continue
        at = parts.index(missing)
        parent = ".".join(parts[:at])
        where = f"config.{parent}" if parent else "the config"
        keys = _config_keys(config_path, parent)
        # a leaf written one level too high (--config.lr) names the section that holds it before a look-alike key
        holders = [k for k in keys or [] if missing in (_config_keys(config_path, ".".join([*parts[:at], k])) or [])]
        close = (suggestion.group(1) if suggestion else f"{holders[0]}.{missing}" if holders else
                 next(iter(difflib.get_close_matches(missing, keys or [], 1)), None))
        if close:
            hint = f"did you mean {_nearest_path(config_path, [*parts[:at], close], parts[at + 1:])!r}?"
        else:
            hint = f"expected one of {keys}" if keys else "see --help for the keys"
        return f"--config.{dotted}: {where} has no key {missing!r}; {hint}"
    return str(chain[-1] if chain else exc).replace("\n", " ").strip("'\"")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    fewer_gc_passes()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("flaxzoo.train").setLevel(logging.INFO)
    if any(arg in ("-h", "--help", "-help", "--helpshort") for arg in argv[1:]):
        from flaxzoo.train import config as config_module

        print(__doc__.strip() + "\n\nConfigs: " + ", ".join(available_configs()) + "\n\n"
              + config_module.__doc__.strip())
        return 0
    argv, error = resolve_config_argument(argv)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    flag_values = flags.FlagValues()
    config_path = next((a.split("=", 1)[1] if "=" in a else argv[i + 1] for i, a in enumerate(argv)
                        if (a == "--config" and i + 1 < len(argv)) or a.startswith("--config=")), str(DEFAULT_CONFIG))
    try:  # ml_collections reads the --config.KEY overrides when the flag is defined: a missing key raises here
        config_flag = config_flags.DEFINE_config_file("config", str(DEFAULT_CONFIG), "the training config file",
                                                      flag_values=flag_values, lock_config=True)
        flags.DEFINE_string("workdir", None, "where checkpoints, logs and the tokenizer go (default runs/CONFIG_NAME)",
                            flag_values=flag_values)
        flag_values(argv)
    except (AttributeError, KeyError) as exc:
        print(f"config error: {config_key_error(exc, argv, config_path)}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    except (flags.Error, TypeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    config = config_flag.value
    workdir = flag_values.workdir or str(pathlib.Path("runs") / _config_name(argv))

    from flaxzoo.train import multihost

    try:
        multihost.initialize()  # before anything touches a device
    except multihost.LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    if config.get("task", None) in ("classify", "tag", "qa", "seq2seq"):
        return finetune_main(config, workdir)

    from flaxzoo.train.checkpoint import CheckpointError
    from flaxzoo.train.config import ConfigError, TrainConfig
    from flaxzoo.train.hooks import NonFiniteLossError, say as _say
    from flaxzoo.train.pretrain import Trainer

    try:
        cfg = TrainConfig.from_config_dict(config)  # checked once, before any data work or compilation
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    trainer = None
    try:
        trainer = Trainer(cfg, workdir)
        summary = trainer.run()
    except (NonFiniteLossError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.FAILED
    except (ValueError, FileNotFoundError) as exc:  # data: tokenizer too big for the model, missing files, ...
        print(f"error: {exc}", file=sys.stderr)
        # Before the first step nothing was computed: the input was bad (2). After it, the run failed (1).
        return exit_codes.FAILED if trainer is not None and trainer.training_started else exit_codes.BAD_INPUT

    wall = time.perf_counter() - _START
    parts = [steps_done(summary, cfg.steps, wall)]
    if summary.compile_s is not None:
        parts.append(f"train-step compile {summary.compile_s:.1f} s")
    if summary.final_eval:
        parts.append(f"final validation loss {summary.final_eval['val_loss']:.4f}, perplexity "
                     f"{summary.final_eval['val_perplexity']:.2f}")
        if cfg.objective == "mlm":
            parts.append(f"masked-token accuracy {100 * summary.final_eval['val_accuracy']:.2f}%")
    if summary.unigram_perplexity:
        parts.append(f"unigram baseline perplexity {summary.unigram_perplexity:.2f}")
    if summary.tokens_per_s:
        parts.append(f"{summary.tokens_per_s:,.0f} tokens/s" + (f", MFU {100 * summary.mfu:.2f}%"
                                                                  if summary.mfu is not None else ""))
    if summary.cpu_peak_flops:
        parts.append(f"CPU matmul peak {summary.cpu_peak_flops / 1e9:.1f} GFLOP/s")
    _say("; ".join(parts))
    _say(next_steps(summary.workdir, argv, stopped=summary.stopped_by is not None))
    return exit_codes.PREEMPTED if summary.stopped_by else exit_codes.FINISHED


def steps_done(summary: Summary, total_steps: int, wall: float) -> str:
    """The first words of the closing line: which steps ran of ``total_steps``, or that none did."""
    first, last = summary.start_step + 1, summary.last_step
    if summary.stopped_by:
        ran = f"steps {first}..{last}" if last >= first else f"before any step, at step {last}"
        return f"stopped by {summary.stopped_by}: {ran} of {total_steps} in {wall:.0f} s wall time"
    if last < first:  # resumed at (or past) the final step
        return f"done: nothing to do, already at step {last} of {total_steps}"
    return f"done: steps {first}..{last} in {wall:.0f} s wall time"


def next_steps(workdir: str, argv: list[str], *, stopped: bool) -> str:
    """Where the run wrote its results and the commands that use them."""
    rerun = " ".join(["python -m flaxzoo.train", *argv[1:]])
    if stopped:
        return (f"results so far in {workdir}; exit code {exit_codes.PREEMPTED}: resume with the same command "
                f"({rerun})")
    return "\n".join([
        f"results in {workdir} (checkpoints/, metrics.jsonl, tensorboard/, tokenizer.json); next:",
        f"  load it:      flaxzoo.models.from_pretrained({workdir!r})",
        f"  convert it:   flaxzoo convert {workdir} {workdir}-hf --to hf",
        f"  TensorBoard:  tensorboard --logdir {workdir}/tensorboard",
        "  train further: the same command with a larger --config.steps (it resumes from the last checkpoint)"])


def finetune_main(config, workdir: str) -> int:
    """``task="classify"`` / ``"tag"`` / ``"qa"`` / ``"seq2seq"`` configs (``configs/finetune_cls.py``,
    ``configs/finetune_ner.py``, ``configs/finetune_qa.py``, ``configs/seq2seq_reverse.py``,
    ``configs/span_corruption.py``): fine-tune an encoder into a text classifier, a token tagger or an extractive
    question answerer, or an encoder-decoder on text pairs, or pre-train one by span corruption."""
    from flaxzoo.train.checkpoint import CheckpointError
    from flaxzoo.train.config import ConfigError
    from flaxzoo.train.finetune.config import FinetuneConfig
    from flaxzoo.train.hooks import NonFiniteLossError, say

    try:
        cfg = FinetuneConfig.from_config_dict(config)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    try:
        if cfg.task == "tag":
            from flaxzoo.train.finetune.tagger import Tagger as Finetuner
        elif cfg.task == "qa":
            from flaxzoo.train.finetune.qa import QuestionAnswering as Finetuner
        elif cfg.task == "seq2seq" and cfg.data.source == "span_corruption":
            from flaxzoo.train.finetune.span_pretrain import SpanCorruptionTrainer as Finetuner
        elif cfg.task == "seq2seq":
            from flaxzoo.train.finetune.seq2seq import Seq2SeqTrainer as Finetuner
        else:
            from flaxzoo.train.finetune.trainer import Finetuner
        finetuner = Finetuner(cfg, workdir)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    except (ValueError, FileNotFoundError) as exc:  # bad data, checkpoint or workdir: nothing was trained
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    try:
        summary = finetuner.run()
    except (NonFiniteLossError, CheckpointError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.FAILED
    wall = time.perf_counter() - _START
    if summary.stopped_by:
        say(f"stopped by {summary.stopped_by} after step {summary.last_step} of {summary.steps} in {wall:.0f} s wall "
            f"time; exit code {exit_codes.PREEMPTED}: resume with the same command")
        return exit_codes.PREEMPTED
    workdir = summary.workdir
    report = ("eval/ scores and predictions, metrics.jsonl, tensorboard/, the model in checkpoints/"
              if cfg.task == "seq2seq" else
              "eval/ report and confusion matrix, metrics.jsonl, tensorboard/, the classifier in checkpoints/")
    say(f"done in {wall:.0f} s wall time; results in {workdir} ({report}); next:\n"
        f"  load it:      flaxzoo.models.from_pretrained({workdir!r})\n"
        f"  convert it:   flaxzoo convert {workdir} {workdir}-hf --to hf\n"
        f"  TensorBoard:  tensorboard --logdir {workdir}/tensorboard"
        + ("" if cfg.task == "seq2seq" else
           "\n  several seeds: python -m flaxzoo.train.finetune.results (docs/fine-tuning.md)"))
    return exit_codes.FINISHED


if __name__ == "__main__":
    sys.exit(main())
