"""The ``flaxzoo`` console script: ``flaxzoo COMMAND [ARGS ...]`` runs ``python -m <module> [ARGS ...]``.

``flaxzoo train --config bert_tiny`` is ``python -m flaxzoo.train --config bert_tiny``; ``flaxzoo help`` lists the
commands. Each command keeps its module's own flags, help and exit codes.
"""

from __future__ import annotations

import runpy
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("flaxzoo.train", "train or fine-tune the model of a config (resumes from the work directory)"),
    "convert": ("flaxzoo.models.io.convert", "convert checkpoints: Hugging Face / GGUF / flaxzoo work directory"),
    "compile": ("flaxzoo.train.tools.compile", "compile a config's step for a TPU / GPU target: memory per chip, FLOPs"),
    "bench": ("flaxzoo.train.tools.bench", "benchmarks: training, decoding, serving, side by side with transformers"),
    "launch": ("flaxzoo.train.launch", "start N local processes as one multi-process job"),
    "data": ("flaxzoo.train.data", "prepare or inspect a config's dataset"),
    "results": ("flaxzoo.train.finetune.results", "fine-tuning result tables (several seeds)"),
    "gpu-check": ("flaxzoo.train.tools.gpu_check", "the prepared accelerator check (one JSON line per figure)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: flaxzoo COMMAND [ARGS ...]   (flaxzoo COMMAND --help for a command's flags)", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; expected one of {', '.join(COMMANDS)}\n\n{usage()}", file=sys.stderr)
        return 2
    module = COMMANDS[name][0]
    sys.argv = [f"flaxzoo {name}", *rest]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:  # the module's own exit code
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
