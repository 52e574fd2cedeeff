"""``python -m flaxzoo.train.bench --work classify [--classifier WORKDIR] [--rounds N]``: serving speed of a MiniLM headline
classifier, flaxzoo beside transformers in the same process.

The classifier is a fine-tuned work directory (``--classifier``, e.g. ``runs/finetune_cls``), else the packaged
all-MiniLM-L6-v2 with a 5-class head (same shapes and cost as a fine-tuned one). The inputs are BBC headlines (the
test split, fetched at run time) or, when they cannot be fetched, a fixed list of headline-like sentences.

- batch 1: each headline alone, text in, label out (tokenise, pad to a multiple of 8 tokens, the jitted forward,
  softmax): the median over the headlines of ms per headline; flaxzoo's first call (the compile of its bucket) is
  reported apart.
- batch 64: all headlines in batches of 64: headlines per second (median of the rounds).

transformers: ``AutoModelForSequenceClassification`` loaded from this classifier's ``save_pretrained`` export (the
same weights), its fast tokenizer built from the same ``tokenizers`` object, ``torch.inference_mode()``, fp32,
dynamic padding per batch, ``torch.set_num_threads(os.cpu_count())``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np

FALLBACK_HEADLINES = [
    "Markets rally as interest rates hold steady", "Striker seals late win for the champions",
    "New handset promises a week of battery life", "Minister faces questions over school funding",
    "Film festival opens with a record crowd", "Oil prices climb on supply worries",
    "Coach names squad for the autumn series", "Chip maker unveils a faster processor",
]


def load_classifier(path: str | None) -> tuple[Any, Any, str]:
    """``(model, tokenizer, source)``: the fine-tuned work directory ``path``, else the packaged MiniLM with a fresh
    5-class head."""
    from flaxzoo import models
    from flaxzoo.models.architectures.encoder import BertForSequenceClassification
    from flaxzoo.train.finetune.classifier import packaged_minilm

    source = path or packaged_minilm()
    model = models.from_pretrained(source, cls=BertForSequenceClassification, **({} if path else {"num_labels": 5}))
    return model, models.load_tokenizer(source), str(source)


def headlines(limit: int) -> tuple[list[str], str]:
    """``(texts, what they are)``: the first ``limit`` BBC test headlines, else the fixed sentences repeated."""
    try:
        from flaxzoo.train.finetune.config import ClassifyDataConfig
        from flaxzoo.train.finetune.data import load_labelled

        texts = load_labelled(ClassifyDataConfig.from_values({})).texts["test"]
        return texts[:limit], f"BBC headlines (test split, first {min(limit, len(texts))})"
    except (OSError, ValueError) as exc:
        print(f"  (BBC headlines unavailable: {exc}; using {len(FALLBACK_HEADLINES)} fixed sentences)")
        return (FALLBACK_HEADLINES * (limit // len(FALLBACK_HEADLINES) + 1))[:limit], "fixed sentences"


def flaxzoo_side(model: Any, tokenizer: Any, texts: list[str]) -> dict[str, Any]:
    """flaxzoo's ``Classifier``: ms per headline at batch 1 (every bucket compiled first), headlines/s at batch 64."""
    from flaxzoo.models.inference.classifier import Classifier

    single = Classifier(model, tokenizer, batch_size=1)
    start = time.perf_counter()
    single(texts[0])
    first_s = time.perf_counter() - start
    for text in texts:  # compile every bucket the headlines need before timing
        single(text)
    per_text = []
    for text in texts:
        start = time.perf_counter()
        single(text)
        per_text.append(time.perf_counter() - start)
    batched = Classifier(model, tokenizer, batch_size=64)
    batched(texts)
    start = time.perf_counter()
    _, probabilities = batched(texts)
    return {"ms_per_headline_batch1": 1e3 * statistics.median(per_text), "first_call_s": first_s,
            "headlines_per_s_batch64": len(texts) / (time.perf_counter() - start),
            "labels": probabilities.argmax(-1).tolist()}


def transformers_side(model: Any, tokenizer: Any, texts: list[str]) -> dict[str, Any]:
    """The same classifier exported to transformers (PyTorch), timed as :func:`flaxzoo_side`."""
    import torch
    import transformers

    from flaxzoo.models import save_pretrained
    from flaxzoo.models.inference.text import plain_tokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(model, folder)
        hf = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=plain_tokenizer(tokenizer), pad_token="[PAD]")

    def run(batch: list[str]) -> list[int]:
        encoded = fast(batch, padding=True, truncation=True, max_length=512, return_tensors="pt")
        with torch.inference_mode():
            return hf(**encoded).logits.softmax(-1).argmax(-1).tolist()

    run(texts[:2])
    per_text = []
    for text in texts:
        start = time.perf_counter()
        run([text])
        per_text.append(time.perf_counter() - start)
    start = time.perf_counter()
    labels = [label for i in range(0, len(texts), 64) for label in run(texts[i:i + 64])]
    return {"ms_per_headline_batch1": 1e3 * statistics.median(per_text),
            "headlines_per_s_batch64": len(texts) / (time.perf_counter() - start), "labels": labels}


def run_classify(args: argparse.Namespace) -> dict[str, Any]:
    """Both sides, ``args.rounds`` times, interleaved; prints a small table and returns the medians."""
    import jax
    import torch
    import transformers

    model, tokenizer, source = load_classifier(getattr(args, "classifier", None))
    texts, what = headlines(getattr(args, "headlines", 256))
    print(f"classify [{source}; {what}; {len(texts)} headlines; jax {jax.__version__}, transformers "
          f"{transformers.__version__}, torch {torch.__version__}]", flush=True)
    rounds: dict[str, list] = {"flaxzoo": [], "transformers": []}
    agreement = []
    for index in range(args.rounds):
        ours = flaxzoo_side(model, tokenizer, texts)
        time.sleep(1.0)
        theirs = transformers_side(model, tokenizer, texts)
        agree = float(np.mean(np.asarray(ours["labels"]) == np.asarray(theirs["labels"])))
        agreement.append(agree)
        for side, r in (("flaxzoo", ours), ("transformers", theirs)):
            rounds[side].append(r)
            first = f", first call {r['first_call_s']:.2f} s" if "first_call_s" in r else ""
            print(f"  round {index + 1}, {side + ':':<14s} batch 1: {r['ms_per_headline_batch1']:.2f} ms/headline; "
                  f"batch 64: {r['headlines_per_s_batch64']:,.0f} headlines/s{first}", flush=True)
        print(f"  round {index + 1}: the two sides' labels agree on {100 * agree:.1f}% of the headlines", flush=True)
    summary = {side: {key: statistics.median(r[key] for r in rs) for key in ("ms_per_headline_batch1",
                                                                             "headlines_per_s_batch64")}
               for side, rs in rounds.items()}
    ours, theirs = summary["flaxzoo"], summary["transformers"]
    print(f"  median: batch 1 {ours['ms_per_headline_batch1']:.2f} vs {theirs['ms_per_headline_batch1']:.2f} "
          f"ms/headline ({theirs['ms_per_headline_batch1'] / ours['ms_per_headline_batch1']:.2f}x faster); batch 64 "
          f"{ours['headlines_per_s_batch64']:,.0f} vs {theirs['headlines_per_s_batch64']:,.0f} headlines/s "
          f"({ours['headlines_per_s_batch64'] / theirs['headlines_per_s_batch64']:.2f}x)", flush=True)
    return {"work": "classify", "source": source, "inputs": what, "headlines": len(texts),
            "label_agreement": min(agreement), **summary}
