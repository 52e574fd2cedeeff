"""Tiny fine-tuning data the engine tests write: one lower-case WordPiece vocabulary over every word they use (a
``vocab.txt`` BERT's tokenizer reads, under 300 ids for the tiny models), SQuAD-style questions whose answer spans
are known, and labelled texts."""

from __future__ import annotations

import csv
import json
import pathlib
import random

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PEOPLE = ["alice", "bob", "maria", "john", "wei", "olga", "omar", "lena"]
PLACES = ["paris", "london", "tokyo", "cairo", "lima", "oslo", "rome", "delhi"]
COLOURS = ["red", "blue", "green", "black"]
FILLER = ["today", "the", "team", "said", "that", "went", "to", "visited", "met", "in", "from", "with", "a", "new",
          "after", "says", "over", "for", "and", "then", "it", "was", "quiet", "sunny", "day"]
QUESTION_WORDS = ["where", "does", "live", "what", "colour", "is", "car", "of", "lives", "has", "?", ".", ","]
TOPICS = {"sport": ["goal", "match", "coach", "league"], "money": ["bank", "shares", "profit", "market"],
          "film": ["movie", "actor", "oscar", "studio"]}


def words() -> list[str]:
    """Every word of the tests' texts (CoNLL sentences of ``test_tagging`` included), specials first."""
    from test_tagging import FILLER as TAG_FILLER, PEOPLE as TAG_PEOPLE, PLACES as TAG_PLACES

    found = set(PEOPLE + PLACES + COLOURS + FILLER + QUESTION_WORDS + TAG_FILLER)
    found |= {w for ws in TOPICS.values() for w in ws}
    found |= {w for name in TAG_PEOPLE + TAG_PLACES for w in name}
    return SPECIALS + sorted(found)


def write_vocab(directory: pathlib.Path) -> pathlib.Path:
    """``directory/vocab.txt`` (BERT's WordPiece format, lower case); the folder is a ``--config.tokenizer``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(words()) + "\n")
    return directory


def squad_questions(n: int, seed: int, *, sentences: int = 4) -> list[dict]:
    """SQuAD-style paragraphs, each a made-up context of facts ("omar lives in oslo .", "the car of omar is red .")
    among filler sentences, and one question about one of its facts, the answer's span known by construction."""
    rng = random.Random(seed)
    paragraphs = []
    for i in range(n):
        parts, facts = [], []
        for _ in range(sentences):
            kind = rng.randrange(3)
            if kind == 0:
                person, place = rng.choice(PEOPLE), rng.choice(PLACES)
                facts.append((f"where does {person} live ?", place, len(" ".join(parts + [f"{person} lives in"])) + 1))
                parts.append(f"{person} lives in {place} .")
            elif kind == 1:
                person, colour = rng.choice(PEOPLE), rng.choice(COLOURS)
                facts.append((f"what colour is the car of {person} ?", colour,
                              len(" ".join(parts + [f"the car of {person} is"])) + 1))
                parts.append(f"the car of {person} is {colour} .")
            else:
                parts.append(" ".join(rng.sample(FILLER, 5)) + " .")
        if not facts:
            person, place = rng.choice(PEOPLE), rng.choice(PLACES)
            facts.append((f"where does {person} live ?", place, len(" ".join(parts + [f"{person} lives in"])) + 1))
            parts.append(f"{person} lives in {place} .")
        context = " ".join(parts)
        question, answer, start = rng.choice(facts)
        assert context[start:start + len(answer)] == answer
        paragraphs.append({"context": context, "qas": [{"id": f"q{seed}-{i}", "question": question,
                                                         "answers": [{"text": answer, "answer_start": start}]}]})
    return paragraphs


def write_squad(path: pathlib.Path, n: int, seed: int, **kwargs) -> str:
    path.write_text(json.dumps({"version": "test", "data": [{"title": "made up",
                                                             "paragraphs": squad_questions(n, seed, **kwargs)}]}))
    return str(path)


def labelled_rows(n: int, seed: int) -> list[tuple[str, str]]:
    """Texts of two topic words among three filler words, the topic as the label."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = list(TOPICS)[i % len(TOPICS)]
        text = rng.sample(TOPICS[label], 2) + rng.sample(FILLER, 3)
        rng.shuffle(text)
        out.append((" ".join(text), label))
    return out


def write_rows(path: pathlib.Path, rows: list[tuple[str, str]]) -> str:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("text", "label"))
        writer.writerows(rows)
    return str(path)
