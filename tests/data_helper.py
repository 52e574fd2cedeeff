"""Runs pieces of the data pipeline in a fresh process for tests/test_data.py (determinism, resume, no TensorFlow).

Usage: python tests/data_helper.py COMMAND CONFIG_JSON OUT [K]
  batches  CONFIG OUT K   write the first K batches of the train iterator to OUT (.npz)
  save     CONFIG OUT K   iterate K batches, write the iterator's position (the next global batch) to OUT (text)
  resume   CONFIG OUT K   start an iterator at the position in OUT + ".state", write its first batch to OUT (.npz)
  full     CONFIG OUT     tokenizer + prepare + 3 batches; write {"tensorflow_imported": ..., ...} to OUT (.json)
"""

import json
import pathlib
import sys



def _save_batches(path, batches):
    import numpy as np

    np.savez(path, **{f"{i}/{k}": v for i, b in enumerate(batches) for k, v in b.items()})


def main(argv):
    from flaxzoo.train import data

    command, cfg_json, out = argv[0], argv[1], argv[2]
    k = int(argv[3]) if len(argv) > 3 else 0
    cfg = data.DataConfig(**json.loads(cfg_json))
    if command == "batches":
        it = data.make_iterator(cfg, "train")
        _save_batches(out, [next(it) for _ in range(k)])
    elif command == "save":
        it = data.make_iterator(cfg, "train")
        for _ in range(k):
            next(it)
        pathlib.Path(out).write_text(str(it.position))
    elif command == "resume":
        it = data.make_iterator(cfg, "train", start=int(pathlib.Path(out + ".state").read_text()))
        _save_batches(out, [next(it)])
    elif command == "full":
        tok = data.build_tokenizer(cfg)
        sources = data.prepare(cfg, tok)
        it = data.make_iterator(cfg, "train", tok, sources=sources)
        shapes = [{name: list(v.shape) for name, v in next(it).items()} for _ in range(3)]
        pathlib.Path(out).write_text(json.dumps({
            "tensorflow_imported": "tensorflow" in sys.modules,
            "tf_like_modules": sorted(m for m in sys.modules if m == "tensorflow" or m.startswith("tensorflow.")),
            "splits": {name: len(src) for name, src in sources.items()},
            "shapes": shapes,
        }))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
