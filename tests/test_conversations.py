"""Conversations as supervised fine-tuning rows (``flaxzoo.train.data.conversations``): the assistant-token mask
against transformers' ``apply_chat_template(..., return_assistant_tokens_mask=True)`` (quick) and TRL's
``SFTTrainer`` datasets (slow): ``assistant_only_loss=True`` on a template with ``{% generation %}`` markers (TRL's
own training template of the ChatML family), and its prompt-completion masking turn by turn for SmolLM2's template,
which has none. The conversations are drawn from a seed: multi-turn, with and without a system message, with tool
calls and tool replies, texts with spaces, newlines and non-ASCII letters at the turns' edges."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

from flaxzoo.models.io.chat import ChatTemplateError, load_chat_template
from flaxzoo.models.io.tokenizer import load_tokenizer
from flaxzoo.train.data.conversations import (SPANS_FROM, Example, assistant_spans, encode_conversation, fit_examples,
                                             pack_examples, packed_batch, tokens_in_spans, training_example)

WORDS = ["the", "tool", "returns", "42", "café", "naïve", "  spaced", "line\nbreak", "日本", "end.", "?", "a-b",
         "x\n", " y", "<think>", "json", "{}", "ok"]


def random_text(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(1, 7))))


def random_conversation(rng: np.random.Generator, *, tools: bool) -> list[dict]:
    """A system message or not, then 1-3 exchanges; with ``tools``, an exchange may be a tool call, its reply and the
    assistant's answer."""
    messages = [{"role": "system", "content": random_text(rng)}] if rng.random() < 0.5 else []
    for _ in range(int(rng.integers(1, 4))):
        messages.append({"role": "user", "content": random_text(rng)})
        if tools and rng.random() < 0.5:
            call = {"type": "function", "function": {"name": str(rng.choice(["add", "look_up"])),
                                                     "arguments": {"a": int(rng.integers(9)), "q": random_text(rng)}}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "content": random_text(rng)})
        messages.append({"role": "assistant", "content": random_text(rng)})
    return messages


def conversations(seed: int, count: int, *, tools: bool) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    return [random_conversation(rng, tools=tools) for _ in range(count)]


def trl_template(name: str) -> str:
    """A chat template shipped inside the installed TRL (read, never copied here)."""
    spec = importlib.util.find_spec("trl")
    if spec is None:
        pytest.fail("TRL is the reference: pip install -e '.[test]'")
    return (pathlib.Path(list(spec.submodule_search_locations)[0]) / "chat_templates" / name).read_text()


@pytest.fixture(scope="module")
def smol_tokenizer():
    return load_tokenizer("smollm2-135m-instruct")


def hf_tokenizer(tokenizer, chat_template: str):
    """transformers' fast tokenizer over the same ``tokenizers`` object (the same offsets), with ``chat_template``."""
    import transformers

    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, chat_template=chat_template,
                                                bos_token="<|im_start|>", eos_token="<|im_end|>",
                                                pad_token="<|endoftext|>")


@pytest.mark.slow_variants
@pytest.mark.parametrize("seed", [0, 1])
def test_generation_markers_give_transformers_assistant_masks(smol_tokenizer, seed):
    template_text = trl_template("qwen2_5_training.jinja")
    hf = hf_tokenizer(smol_tokenizer, template_text)
    template = load_chat_template(template_text)
    for messages in conversations(seed, 12, tools=True):
        ours = encode_conversation(template, smol_tokenizer, messages)
        theirs = hf.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        assert ours.spans_from == SPANS_FROM[0]
        assert ours.ids.tolist() == list(theirs["input_ids"])
        assert ours.assistant_mask.astype(int).tolist() == list(theirs["assistant_masks"]), messages
        assert ours.assistant_mask.any() and not ours.assistant_mask.all()


def test_rendered_turns_cover_each_reply_and_its_end_of_turn_on_smollm2(smol_tokenizer):
    template = load_chat_template("smollm2-135m-instruct")
    for messages in conversations(2, 12, tools=False):
        ours = encode_conversation(template, smol_tokenizer, messages)
        assert ours.spans_from == SPANS_FROM[1]
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        assert [ours.text[a:b] for a, b in ours.spans] == [f"{reply}<|im_end|>\n" for reply in replies]
        offsets = np.asarray(smol_tokenizer.encode(ours.text, add_special_tokens=False).offsets)
        for (start, end), reply in zip(ours.spans, replies):
            # The turn's tokens: its text, and before it at most the rest of one token that straddles the header's
            # end (byte-level BPE joins the header's newline to a reply's leading spaces).
            turn = tokens_in_spans(offsets, [(start, end)])
            first, last = offsets[turn][0][0], offsets[turn][-1][1]
            assert last == end and ours.text[first:last].endswith(f"{reply}<|im_end|>\n")
            straddling = tokens_in_spans(offsets, [(first, start)]).sum() == 1
            assert first == start or (ours.text[first:start].isspace() and straddling)
        assert np.array_equal(ours.assistant_mask, tokens_in_spans(offsets, ours.spans))


def test_tokens_in_spans_counts_a_token_that_straddles_an_edge():
    offsets = [(0, 3), (3, 5), (5, 9), (9, 9), (9, 12)]
    assert tokens_in_spans(offsets, [(4, 9)]).tolist() == [False, True, True, False, False]
    assert tokens_in_spans(offsets, [(0, 1), (10, 11)]).tolist() == [True, False, False, False, True]
    assert tokens_in_spans(offsets, []).tolist() == [False] * 5


def test_conversations_without_a_reply_or_a_prompt_are_refused(smol_tokenizer):
    smol = load_chat_template("smollm2-135m-instruct")
    with pytest.raises(ChatTemplateError, match="has no assistant message"):
        assistant_spans(smol, [{"role": "user", "content": "hi"}])
    with pytest.raises(ChatTemplateError, match="message 0 is the assistant's"):
        assistant_spans(smol, [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "yo"}])
    marked = load_chat_template(trl_template("qwen2_5_training.jinja"))
    with pytest.raises(ChatTemplateError, match="marked no assistant text"):
        assistant_spans(marked, [{"role": "user", "content": "hi"}])


def test_a_template_that_rewrites_earlier_turns_is_refused():
    # Drops every assistant reply but the last one: the turns before the last are not what the whole renders.
    text = ("{% for m in messages %}{% if m.role != 'assistant' or loop.last %}<{{ m.role }}>{{ m.content }}</s>"
            "{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    with pytest.raises(ChatTemplateError, match="before assistant message 1 differently"):
        assistant_spans(load_chat_template(text), messages)


# ------------------------------------------------------------------------------------------------ TRL's SFTTrainer
def trl_rows(tokenizer, rows: list[dict], tmp_path: pathlib.Path, **settings) -> list[dict]:
    """TRL's ``SFTTrainer`` training dataset for ``rows`` (a tiny random Llama: the dataset does not depend on it):
    each row's ``input_ids`` and ``labels`` (the ids, -100 where the loss is not taken)."""
    import datasets
    import transformers
    from trl import SFTConfig, SFTTrainer

    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    model = transformers.LlamaForCausalLM(config)
    args = SFTConfig(output_dir=str(tmp_path), report_to="none", max_length=None, use_cpu=True, bf16=False,
                     **settings)
    trainer = SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                         processing_class=tokenizer)
    return list(trainer.train_dataset)


@pytest.mark.slow
def test_assistant_masks_equal_trl_sft_with_assistant_only_loss(smol_tokenizer, tmp_path):
    template_text = trl_template("qwen2_5_training.jinja")
    chats = conversations(3, 16, tools=True)
    rows = trl_rows(hf_tokenizer(smol_tokenizer, template_text), [{"messages": m} for m in chats], tmp_path,
                    assistant_only_loss=True)
    template = load_chat_template(template_text)
    for messages, row in zip(chats, rows, strict=True):
        ours = encode_conversation(template, smol_tokenizer, messages)
        assert ours.ids.tolist() == row["input_ids"]
        assert np.where(ours.assistant_mask, ours.ids, -100).tolist() == row["labels"], messages


@pytest.mark.slow
def test_rendered_turns_equal_trl_prompt_completion_masks_turn_by_turn(smol_tokenizer, tmp_path):
    """SmolLM2's template has no markers: each assistant turn's tokens are TRL's completion tokens for the prompt of
    the turns before it (``completion_only_loss``), and the whole conversation's mask is their union."""
    template = load_chat_template("smollm2-135m-instruct")
    hf = hf_tokenizer(smol_tokenizer, template.select())
    chats = conversations(4, 8, tools=False)
    rows, turns = [], []
    for c, messages in enumerate(chats):
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                rows.append({"prompt": messages[:i], "completion": [message]})
                turns.append(c)
    trl = trl_rows(hf, rows, tmp_path, completion_only_loss=True)
    for c, messages in enumerate(chats):
        ours = encode_conversation(template, smol_tokenizer, messages)
        offsets = smol_tokenizer.encode(ours.text, add_special_tokens=False).offsets
        theirs = [row for row, owner in zip(trl, turns) if owner == c]
        assert len(theirs) == len(ours.spans)
        for span, row in zip(ours.spans, theirs):
            length = len(row["input_ids"])
            assert ours.ids[:length].tolist() == row["input_ids"]
            one_turn = tokens_in_spans(offsets, [span])
            assert np.where(one_turn, ours.ids, -100)[:length].tolist() == row["labels"], messages
            assert not one_turn[length:].any()


# ------------------------------------------------------------------------------------------------ rows of examples
@pytest.mark.slow_variants
@pytest.mark.parametrize("preset, seed", [("llama-tiny", 5), ("gpt2-tiny", 6)])
def test_packed_rows_give_the_loss_of_their_conversations_alone(smol_tokenizer, preset, seed):
    """Packed rows (segment ids: no attention across conversations, positions restarting) give the summed loss and
    count of scored tokens of the conversations each in a row of its own (1e-5); truncation and dropping counted."""
    from flax import nnx

    from flaxzoo import models
    from flaxzoo.train.losses import causal_lm_loss

    template = load_chat_template("smollm2-135m-instruct")
    examples = [training_example(encode_conversation(template, smol_tokenizer, messages))
                for messages in conversations(seed, 10, tools=False)]
    seq_len = min(96, max(len(e.inputs) for e in examples) - 1)  # the longest is cut
    kept, counts = fit_examples(examples, seq_len, "truncate")
    assert counts["kept"] == len(kept) and counts["truncated"] + counts["dropped"] >= 1, counts
    rows = pack_examples(kept, seq_len)
    assert len(rows) < len(kept)
    model = models.create_model(models.get_preset(preset, vocab_size=smol_tokenizer.get_vocab_size(), dropout=0.0,
                                                  attention_dropout=0.0), seed=seed)
    model.eval()
    loss = nnx.jit(causal_lm_loss)
    packed = [float(x) for x in loss(model, packed_batch(rows, seq_len, pad_id=0))]
    alone = np.sum([[float(x) for x in loss(model, packed_batch([[e]], seq_len, pad_id=0))] for e in kept], 0)
    assert packed[1] == alone[1] == sum(int((e.targets != -100).sum()) for e in kept)
    np.testing.assert_allclose(packed[:2], alone[:2], rtol=1e-5)


def test_fit_examples_cuts_or_drops_and_says_how_many():
    scored = Example(np.arange(6, dtype=np.int32), np.array([-100, -100, 7, 8, -100, 9], np.int32))
    late = Example(np.arange(6, dtype=np.int32), np.array([-100] * 5 + [9], np.int32))  # its reply past a cut at 4
    short = Example(np.arange(3, dtype=np.int32), np.array([-100, 5, 6], np.int32))
    kept, counts = fit_examples([scored, late, short], 4, "truncate")
    assert [len(e.inputs) for e in kept] == [4, 3] and counts == {"truncated": 2, "dropped": 1, "kept": 2}
    kept, counts = fit_examples([scored, late, short], 4, "drop")
    assert [len(e.inputs) for e in kept] == [3] and counts == {"truncated": 0, "dropped": 2, "kept": 1}
    with pytest.raises(ValueError, match="too_long='cut'"):
        fit_examples([short], 4, "cut")
    with pytest.raises(ValueError, match="longer than seq_len=2"):
        pack_examples([short], 2)
