"""Chat templates (``flaxzoo.models.io.chat``) against transformers' ``AutoTokenizer.apply_chat_template(...,
tokenize=False)``: the packaged SmolLM2-135M-Instruct template, a ChatML template with tools written here, templates
stored every way a Hugging Face directory stores them, a GGUF file written with the gguf package, the errors for bad
input, and ``generate_text(..., messages=...)`` on the real SmolLM2.

The transformers reference is a small tokenizer directory written here (a word-level ``tokenizer.json`` and a
``tokenizer_config.json`` holding the template and special tokens): rendering never tokenizes, so the vocabulary
does not matter.
"""

from __future__ import annotations

import datetime
import json
import pathlib
from typing import Any

import gguf
import jinja2
import pytest
import tokenizers
import transformers

from flaxzoo.models.io.chat import ChatTemplate, ChatTemplateError, apply_chat_template, load_chat_template
from flaxzoo.models.io.gguf import GGUFFile
from flaxzoo.models.io.packaged import SMOLLM2_FILE, smollm2_gguf

transformers.logging.set_verbosity_error()

SMOL_TOKENS = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
               "pad_token": "<|im_end|>"}

# A ChatML template in the style of Qwen2.5-Instruct's, written for these tests: a tools section (tojson, one
# schema indented), tool calls and grouped tool responses (loop.previtem / nextitem), content given as a list of
# parts (continue), at most three calls shown (break), raise_exception for misplaced system messages and unknown
# roles, a namespace, and blocks both with and without whitespace control (trim_blocks / lstrip_blocks).
CHATML_TOOLS = """{%- set ns = namespace(system=none, start=0) %}
{%- if messages[0].role == 'system' %}
    {%- set ns.system = messages[0].content %}
    {%- set ns.start = 1 %}
{%- endif %}
<|im_start|>system
{{ ns.system if ns.system is not none else 'You are a helpful assistant.' }}
{% if tools %}

# Tools

You may call one or more functions to assist with the user query.
<tools>
{% for tool in tools %}
    {% if loop.first %}
{{ tool | tojson(indent=2) }}
    {% else %}
{{ tool | tojson }}
    {% endif %}
{% endfor %}
</tools>

For each call, return <tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>
{% endif %}
<|im_end|>
{% for message in messages[ns.start:] %}
    {% if message.role == 'system' %}
        {{ raise_exception('System message must come first, found one at position ' ~ (loop.index0 + ns.start)) }}
    {% elif message.role not in ('user', 'assistant', 'tool') %}
        {{ raise_exception('Unknown role: ' ~ message.role) }}
    {% endif %}
    {% if message.role == 'tool' %}
        {% if loop.first or loop.previtem.role != 'tool' %}
<|im_start|>user
        {% endif %}
<tool_response>
{{ message.content }}
</tool_response>
        {% if loop.last or loop.nextitem.role != 'tool' %}
<|im_end|>
        {% endif %}
        {% continue %}
    {% endif %}
<|im_start|>{{ message.role }}
{% if message.content is string %}{{ message.content }}{% elif message.content is defined %}
{%- for part in message.content %}{% if part.type != 'text' %}{% continue %}{% endif %}{{ part.text }}{% endfor %}
{%- endif %}
    {% for call in message.tool_calls | default([]) %}
        {% if loop.index > 3 %}{% break %}{% endif %}
        {% set fn = call.function if call.function is defined else call %}

<tool_call>
{"name": "{{ fn.name }}", "arguments": {{ fn.arguments | tojson(sort_keys=true) }}}
</tool_call>
    {% endfor %}
<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Température à <ville> & ses environs",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
                                          "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


USER = [{"role": "user", "content": "What is the capital of France?"}]
SYSTEM_USER = [{"role": "system", "content": "You answer in one word."}, *USER]
MULTI_TURN = [{"role": "system", "content": "Be brief."}, *USER, {"role": "assistant", "content": "Paris."},
              {"role": "user", "content": "And of Italy?"}]
ASSISTANT_LAST = [*USER, {"role": "assistant", "content": "Paris."}]
TOOL_TURNS = [
    {"role": "user", "content": "Weather and time in Paris, please."},
    {"role": "assistant", "content": None, "tool_calls": [call("get_weather", city="Paris", unit="C"),
                                                          call("get_time", zone="Europe/Paris")]},
    {"role": "tool", "name": "get_weather", "content": '{"temperature": 21}'},
    {"role": "tool", "name": "get_time", "content": "14:05"},
    {"role": "assistant", "content": "21 °C, and it is 14:05."},
    {"role": "user", "content": "Thanks!"},
]
MANY_CALLS = [USER[0], {"role": "assistant", "content": "Checking.",
                        "tool_calls": [call("get_time", zone=z) for z in ("A", "B", "C", "D", "E")]}]
PARTS = [{"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image"},
                                      {"type": "text", "text": "what is it?"}]}]


# ------------------------------------------------------------------------------------------------------ helpers
def write_tokenizer_dir(folder: pathlib.Path, chat_template: Any = None, *, config: dict | None = None,
                        files: dict[str, str] | None = None, **special: Any) -> pathlib.Path:
    """A Hugging Face tokenizer directory: a word-level ``tokenizer.json``, a ``tokenizer_config.json`` with
    ``chat_template`` (when given), the special tokens and ``config``, and more ``files`` ({relative path: text})."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = sorted({t["content"] if isinstance(t, dict) else t for t in special.values()} - {"<unk>"})
    vocab = {"<unk>": 0, **{token: i + 1 for i, token in enumerate(texts)}}
    tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>")).save(str(folder / "tokenizer.json"))
    data = {"tokenizer_class": "PreTrainedTokenizerFast", **special, **(config or {})}
    if chat_template is not None:
        data["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(data), encoding="utf-8")
    for name, text in (files or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def reference(folder: pathlib.Path) -> Any:
    """transformers' tokenizer of ``folder``."""
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def hf_render(tok: Any, messages: list, **kwargs: Any) -> str:
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


# ----------------------------------------------------------------------------------------- the packaged SmolLM2
@pytest.fixture(scope="module")
def smol_template() -> str:
    return GGUFFile(smollm2_gguf()).get("tokenizer.chat_template")


@pytest.fixture(scope="module")
def smol_hf(tmp_path_factory, smol_template) -> Any:
    """transformers' tokenizer with the SmolLM2 GGUF's template and special tokens in its tokenizer_config.json
    (transformers' GGUF tokenizer loader does not keep the template)."""
    return reference(write_tokenizer_dir(tmp_path_factory.mktemp("smol_hf"), smol_template, **SMOL_TOKENS))


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", [SYSTEM_USER, USER, MULTI_TURN, ASSISTANT_LAST],
                         ids=["system+user", "user", "multi-turn", "assistant-last"])
def test_smollm2_template_matches_transformers(smol_hf, messages, add_generation_prompt):
    ours = apply_chat_template("smollm2-135m-instruct", messages, add_generation_prompt=add_generation_prompt)
    assert ours == hf_render(smol_hf, messages, add_generation_prompt=add_generation_prompt)
    assert ours.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_smollm2_template_found_from_every_source(smol_template):
    gguf_file = smollm2_gguf()
    expected = ChatTemplate({"default": smol_template}, SMOL_TOKENS, str(gguf_file))
    for source in ("smollm2-135m-instruct", "SmolLM2-135M-Instruct", gguf_file, str(gguf_file), gguf_file.parent):
        assert load_chat_template(source) == expected, source
    assert gguf_file.name == SMOLLM2_FILE
    assert "You are a helpful AI assistant named SmolLM" in apply_chat_template(gguf_file, USER)


# ------------------------------------------------------------------------------------- a ChatML template, tools
@pytest.fixture(scope="module")
def chatml_dir(tmp_path_factory) -> pathlib.Path:
    return write_tokenizer_dir(tmp_path_factory.mktemp("chatml"), CHATML_TOOLS, eos_token="<|im_end|>",
                               pad_token="<|endoftext|>")


@pytest.fixture(scope="module")
def chatml_hf(chatml_dir) -> Any:
    return reference(chatml_dir)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages, tools", [
    (USER, None), (SYSTEM_USER, None), (MULTI_TURN, None), (USER, [WEATHER, CLOCK]), (SYSTEM_USER, [WEATHER]),
    (TOOL_TURNS, [WEATHER, CLOCK]), (MANY_CALLS, [CLOCK]), (PARTS, []),
], ids=["user", "system+user", "multi-turn", "tools", "system+tools", "tool-turns", "many-calls", "parts"])
def test_chatml_template_with_tools_matches_transformers(chatml_dir, chatml_hf, messages, tools,
                                                         add_generation_prompt):
    ours = apply_chat_template(chatml_dir, messages, tools=tools, add_generation_prompt=add_generation_prompt)
    assert ours == hf_render(chatml_hf, messages, tools=tools, add_generation_prompt=add_generation_prompt)
    if tools and WEATHER in tools:
        assert "Température à <ville> & ses environs" in ours  # tojson: no \\u escapes, no HTML escapes
    if messages is MANY_CALLS:
        assert ours.count('<tool_call>\n{"name": "get_time"') == 3  # {% break %} after three


def test_chatml_template_refusal_is_passed_through(chatml_dir, chatml_hf):
    late_system = [*USER, {"role": "system", "content": "late"}]
    with pytest.raises(jinja2.TemplateError, match="found one at position 1"):
        hf_render(chatml_hf, late_system)
    with pytest.raises(ChatTemplateError, match="System message must come first, found one at position 1"):
        apply_chat_template(chatml_dir, late_system)
    with pytest.raises(ChatTemplateError, match="Unknown role: narrator"):
        apply_chat_template(chatml_dir, [{"role": "narrator", "content": "Once upon a time"}])


def test_extra_variables_reach_the_template_and_win_over_special_tokens(chatml_dir, chatml_hf):
    template = "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ documents }}|{{ flag }}|{{ unk_token }}"
    for extra in ({}, {"flag": False, "eos_token": "<END>"}, {"documents": [{"title": "t", "text": "x"}]}):
        ours = apply_chat_template(ChatTemplate({"default": template}, load_chat_template(chatml_dir).special_tokens),
                                   USER, **extra)
        assert ours == hf_render(chatml_hf, USER, chat_template=template, **extra), extra
    assert apply_chat_template(template, USER, bos_token="<s>") == "<s>|||None||"


# -------------------------------------------------------------------------- how directories store templates
def test_directory_storage_forms_match_transformers(tmp_path):
    default, tool_use = "D{% for m in messages %}[{{ m.content }}]{% endfor %}", "T{{ tools | tojson }}"
    named = [{"name": "default", "template": default}, {"name": "tool_use", "template": tool_use}]
    listed = write_tokenizer_dir(tmp_path / "listed", named, eos_token="</s>")
    jinja = write_tokenizer_dir(tmp_path / "jinja", "ignored: the .jinja file wins {{ x }}", eos_token="</s>",
                                files={"chat_template.jinja": default,
                                       "additional_chat_templates/tool_use.jinja": tool_use,
                                       "additional_chat_templates/short.jinja": "S{{ messages | length }}"})
    for folder in (listed, jinja):
        hf = reference(folder)
        assert apply_chat_template(folder, USER) == hf_render(hf, USER, add_generation_prompt=True) == "D[" + \
            USER[0]["content"] + "]"
        assert apply_chat_template(folder, USER, tools=[CLOCK]) == hf_render(hf, USER, tools=[CLOCK])
        assert apply_chat_template(folder, USER, tools=[CLOCK]).startswith("T[")
        assert apply_chat_template(folder, USER, template_name="tool_use") == hf_render(hf, USER,
                                                                                        chat_template="tool_use")
    assert apply_chat_template(jinja, USER, template_name="short") == "S1"
    assert load_chat_template(jinja).names == ["default", "short", "tool_use"]
    assert apply_chat_template(jinja / "chat_template.jinja", MULTI_TURN) == "D" + "".join(
        f"[{m['content']}]" for m in MULTI_TURN)
    assert load_chat_template(listed / "tokenizer_config.json").templates == {"default": default,
                                                                               "tool_use": tool_use}


def test_special_tokens_from_config_dicts_and_the_map_file(tmp_path):
    template = "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ sep_token }}|{{ mask_token }}"
    added = {"__type": "AddedToken", "content": "<s>", "lstrip": False, "rstrip": False, "normalized": False,
             "single_word": False}
    folder = write_tokenizer_dir(tmp_path / "dicts", template, bos_token=added, eos_token="</s>",
                                 files={"special_tokens_map.json": json.dumps({"pad_token": {"content": "<pad>"}})})
    assert load_chat_template(folder).special_tokens == {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    assert apply_chat_template(folder, USER) == hf_render(reference(folder), USER) == "<s>|</s>|<pad>||"


def test_legacy_chat_template_json(tmp_path):
    template = "L{{ messages[0].content }}"
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    assert load_chat_template(tmp_path).templates == {"default": template}
    assert apply_chat_template(tmp_path / "chat_template.json", USER) == "L" + USER[0]["content"]


def test_template_text_given_directly(chatml_hf):
    for messages in (USER, TOOL_TURNS):
        assert apply_chat_template(CHATML_TOOLS, messages, tools=[WEATHER], eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>") == hf_render(chatml_hf, messages, tools=[WEATHER],
                                                                           add_generation_prompt=True)


def test_environment_globals_and_blocks_match_transformers(chatml_hf):
    cases = [
        "{{ strftime_now('%Y-%m-%d') }}",
        "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}",
        "{% set d = dict(a=1, b=[2]) %}{{ d | tojson }}|{{ dict.fromkeys(['x'], 0) | tojson }}",
        "{{ {'b': '<é>', 'a': 1} | tojson(sort_keys=true, separators=(',', ':')) }}",
        "  {% if add_generation_prompt %}\n    yes\n  {% endif %}\nend",
    ]
    for template in cases:
        assert apply_chat_template(template, USER) == hf_render(chatml_hf, USER, chat_template=template,
                                                                add_generation_prompt=True), template
    assert apply_chat_template(cases[0], USER) == datetime.datetime.now().strftime("%Y-%m-%d")
    with pytest.raises(ChatTemplateError, match="SecurityError"):
        apply_chat_template("{% set ns = namespace(_hidden=1) %}", USER)
    with pytest.raises(ChatTemplateError, match="SecurityError"):
        apply_chat_template("{{ messages.__class__ }}{{ ''.__class__.__mro__ }}", USER)


def test_message_keys_set_to_none_are_dropped_and_reasoning_is_aliased(chatml_hf):
    template = ("{% for m in messages %}{{ m.role }}:{{ 'content' in m }}:{{ m.reasoning_content }}:"
                "{{ m.thinking }};{% endfor %}")
    messages = [{"role": "user", "content": "hi", "name": None},
                {"role": "assistant", "content": "ok", "reasoning": "because"}]
    ours = apply_chat_template(template, messages, add_generation_prompt=False)
    assert ours == hf_render(chatml_hf, messages, chat_template=template)
    assert ours == "user:True::;assistant:True:because:because;"


# --------------------------------------------------------------------------------------------------- GGUF files
def write_gguf(path: pathlib.Path, templates: Any, *, tokens: list[str], **ids: int) -> pathlib.Path:
    """A GGUF file with a tokenizer's tokens, the special token ids ``ids`` (bos / eos / unk / pad / sep / mask)
    and ``templates`` (text, or a list of ``{"name", "template"}``); no tensors."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    for name, value in ids.items():
        getattr(writer, f"add_{name}_token_id")(value)
    if templates is not None:
        writer.add_chat_template(templates)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


GGUF_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
GGUF_TOOL_TEMPLATE = "{{ bos_token }}tools={{ tools | tojson }}{% for m in messages %}|{{ m.content }}{% endfor %}"


def test_gguf_template_matches_transformers(tmp_path):
    tokens = ["<unk>", "<s>", "</s>", "<pad>", "<sep>", "hello"]
    file = write_gguf(tmp_path / "chat.gguf", GGUF_TEMPLATE, tokens=tokens, bos=1, eos=2, unk=0, pad=3, sep=4)
    hf = reference(write_tokenizer_dir(tmp_path / "hf", GGUF_TEMPLATE, bos_token="<s>", eos_token="</s>",
                                       unk_token="<unk>", pad_token="<pad>", sep_token="<sep>"))
    template = load_chat_template(file)
    assert template.special_tokens == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                       "pad_token": "<pad>", "sep_token": "<sep>"}
    for messages in (USER, SYSTEM_USER, MULTI_TURN):
        for add in (True, False):
            ours = apply_chat_template(file, messages, add_generation_prompt=add)
            assert ours == hf_render(hf, messages, add_generation_prompt=add)
    assert apply_chat_template(tmp_path, USER) == apply_chat_template(file, USER)  # a folder with one .gguf


def test_gguf_named_templates_match_transformers(tmp_path):
    named = [{"name": "default", "template": GGUF_TEMPLATE}, {"name": "tool_use", "template": GGUF_TOOL_TEMPLATE}]
    file = write_gguf(tmp_path / "named.gguf", named, tokens=["<unk>", "<s>", "</s>"], bos=1, eos=2)
    assert GGUFFile(file).get("tokenizer.chat_templates") == ["tool_use"]
    hf = reference(write_tokenizer_dir(tmp_path / "hf", named, bos_token="<s>", eos_token="</s>"))
    for tools in (None, [WEATHER]):
        ours = apply_chat_template(file, MULTI_TURN, tools=tools)
        assert ours == hf_render(hf, MULTI_TURN, tools=tools, add_generation_prompt=True)
    assert apply_chat_template(file, USER, tools=[WEATHER]).startswith("<s>tools=[{")


# ------------------------------------------------------------------------------------------------ the Hub path
def test_hub_id_fetches_only_template_files(tmp_path, monkeypatch):
    import huggingface_hub

    folder = write_tokenizer_dir(tmp_path / "snapshot", GGUF_TEMPLATE, bos_token="<s>", eos_token="</s>")
    asked = {}

    def snapshot_download(repo_id: str, *, revision: str | None = None, allow_patterns: list | None = None) -> str:
        asked.update(repo_id=repo_id, revision=revision, allow_patterns=allow_patterns)
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.chdir(tmp_path)
    assert apply_chat_template("some-org/some-chat-model", USER) == apply_chat_template(folder, USER)
    assert asked["repo_id"] == "some-org/some-chat-model"
    assert not any("safetensors" in p or p == "*" for p in asked["allow_patterns"])

    def offline(*args: Any, **kwargs: Any) -> str:
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(FileNotFoundError, match="could not be fetched.*no network"):
        load_chat_template("some-org/other-model")


# ----------------------------------------------------------------------------------------------------- errors
def test_no_template_names_the_places_looked(tmp_path):
    write_tokenizer_dir(tmp_path / "bare", eos_token="</s>")
    with pytest.raises(ChatTemplateError, match=r"no chat template found in .*bare: looked for chat_template\.jinja, "
                                                r"additional_chat_templates/\*\.jinja, chat_template\.json "
                                                r"\(chat_template\), tokenizer_config\.json \(chat_template\), a "
                                                r"single \*\.gguf"):
        apply_chat_template(tmp_path / "bare", USER)
    plain = write_gguf(tmp_path / "plain.gguf", None, tokens=["<unk>"], unk=0)
    with pytest.raises(ChatTemplateError, match=r"no chat template found in .*plain\.gguf: its metadata has no "
                                                r"tokenizer\.chat_template"):
        apply_chat_template(plain, USER)
    with pytest.raises(ChatTemplateError, match="holds no chat template"):
        apply_chat_template(tmp_path / "bare" / "tokenizer.json", USER)
    with pytest.raises(FileNotFoundError, match="is not a chat template .* an existing path, a packaged model"):
        apply_chat_template(tmp_path / "missing", USER)
    with pytest.raises(FileNotFoundError, match="is not a chat template"):
        apply_chat_template("no such model, nor a template", USER)
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    with pytest.raises(ChatTemplateError, match="a Tokenizer carries no chat template"):
        apply_chat_template(tok, USER)


@pytest.mark.parametrize("messages, match", [
    ([{"content": "no role"}], r"message 0 has no 'role' string \(its keys: \['content'\]\)"),
    ([*USER, {"role": "assistant"}], r"message 1 \(assistant\) has no 'content'"),
    ([*USER, {"role": "user", "content": None}], r"message 1 \(user\) has no 'content'"),
    ([*USER, "hello"], "message 1 is a str, not a mapping"),
    ([], "messages is empty"),
    ("hello", "messages must be a list"),
    (USER[0], "messages must be a list"),
])
def test_bad_messages(messages, match):
    with pytest.raises(ChatTemplateError, match=match):
        apply_chat_template("{{ messages | length }}", messages)


def test_bad_templates_and_choices(tmp_path):
    with pytest.raises(ChatTemplateError, match=r"does not parse: .*template line 1"):
        apply_chat_template("{% for m in messages %}{{ m.content }}", USER)
    with pytest.raises(ChatTemplateError, match="failed: UndefinedError"):
        apply_chat_template("{{ messages[0].content.missing.deeper }}", USER)
    with pytest.raises(ChatTemplateError, match="failed: stop here"):
        apply_chat_template("{{ raise_exception('stop here') }}", USER)
    both = ChatTemplate({"a": "A", "b": "B"}, origin="two")
    with pytest.raises(ChatTemplateError, match=r"no chat template named 'default' \(two\): pass template_name= "
                                                r"\(one of \['a', 'b'\]\)"):
        apply_chat_template(both, USER)
    assert apply_chat_template(both, USER, template_name="b") == "B"
    with pytest.raises(ChatTemplateError, match=r"no chat template named 'c' \(two\); there are \['a', 'b'\]"):
        apply_chat_template(both, USER, template_name="c")
    with pytest.raises(ChatTemplateError, match=r"tools \[1\] are not JSON schemas"):
        apply_chat_template("x{{ tools }}", USER, tools=[WEATHER, len])
    only_named = write_tokenizer_dir(tmp_path / "named", files={"additional_chat_templates/only.jinja": "O"})
    with pytest.raises(ValueError, match="no default specified"):
        hf_render(reference(only_named), USER)  # transformers refuses too
    with pytest.raises(ChatTemplateError, match=r"named 'default' \(.*named\): pass template_name= "
                                                r"\(one of \['only'\]\)"):
        apply_chat_template(only_named, USER)
    assert apply_chat_template(only_named, USER, template_name="only") == "O"
    folder = write_tokenizer_dir(tmp_path / "odd", {"not": "a template"})
    with pytest.raises(ChatTemplateError, match="chat_template must be text or a list"):
        load_chat_template(folder)


# ------------------------------------------------------------------------------------------ generate_text(messages)
@pytest.fixture(scope="module")
def smol_model() -> tuple[Any, Any]:
    from flaxzoo.models import from_pretrained, load_tokenizer

    return from_pretrained(smollm2_gguf()), load_tokenizer(smollm2_gguf())


@pytest.mark.slow
def test_generate_text_with_messages_equals_the_rendered_prompt(smol_model):
    from flaxzoo.models import generate_text

    model, tok = smol_model
    rendered = apply_chat_template("smollm2-135m-instruct", SYSTEM_USER)
    by_messages = generate_text(model, tok, messages=SYSTEM_USER, chat_template="smollm2-135m-instruct",
                                max_new_tokens=8, stop_at_eos=False)
    by_prompt = generate_text(model, tok, prompt=rendered, max_new_tokens=8, stop_at_eos=False)
    assert isinstance(by_messages, str) and by_messages == by_prompt
    assert "Paris" in by_messages, by_messages


def test_a_list_of_conversations_renders_to_a_list_of_prompts():
    from flaxzoo.models.inference.text import chat_prompts

    two = [SYSTEM_USER, MULTI_TURN]
    assert chat_prompts(two, smollm2_gguf()) == [apply_chat_template(smollm2_gguf(), m) for m in two]
    assert chat_prompts(USER, "smollm2-135m-instruct") == apply_chat_template("smollm2-135m-instruct", USER)


def test_generate_text_argument_errors():
    """Checked before the model runs: a random tiny decoder stands in for SmolLM2 (whose load costs seconds)."""
    from flaxzoo.models import create_model, generate_text, get_preset, load_tokenizer

    model, tok = create_model(get_preset("llama-tiny")), load_tokenizer(smollm2_gguf())
    with pytest.raises(ValueError, match="a prompt or messages, not both"):
        generate_text(model, tok, "hi", messages=USER, chat_template="smollm2-135m-instruct")
    with pytest.raises(ValueError, match="messages= needs chat_template="):
        generate_text(model, tok, messages=USER)
    with pytest.raises(ValueError, match="chat_template= is for messages="):
        generate_text(model, tok, "hi", chat_template="smollm2-135m-instruct")
    with pytest.raises(ValueError, match="needs a prompt"):
        generate_text(model, tok)
    with pytest.raises(ChatTemplateError, match="message 0 has no 'role'"):
        generate_text(model, tok, messages=[{"content": "hi"}], chat_template="smollm2-135m-instruct")
