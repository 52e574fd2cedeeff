"""Chat templates: a conversation (a list of ``{"role": ..., "content": ...}`` messages) rendered into the one prompt
string an instruct model was trained on, with the Jinja template its checkpoint carries.

``apply_chat_template(source, messages)`` renders as Hugging Face's ``tokenizer.apply_chat_template(messages,
tokenize=False)`` does: the same sandboxed Jinja environment (jinja2's ``ImmutableSandboxedEnvironment`` with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter that leaves non-ASCII text
and ``<>&`` as they are and takes ``indent`` / ``separators`` / ``sort_keys``, the globals ``raise_exception`` and
``strftime_now``, a ``{% generation %}`` block that renders its body: :mod:`flaxzoo.models.io.chat_render`) and the same
variables: ``messages``, ``add_generation_prompt``, ``tools``, ``documents`` (None unless given), the checkpoint's
special tokens (``bos_token``, ``eos_token``, ``unk_token``, ``sep_token``, ``pad_token``, ``cls_token``,
``mask_token``; those it names) and any extra keyword, which wins over a special token of the same name. As there,
message keys whose value is None are dropped before rendering, and a message's reasoning under ``thinking`` /
``reasoning`` is also offered as ``reasoning_content`` (and the other way round).

What ``source`` names, in this order:

* a :class:`ChatTemplate` (what :func:`load_chat_template` returns): used as it is;
* a string holding ``{{``, ``{%`` or ``{#`` (Jinja's delimiters, which no path has): the template text itself, with
  no special tokens (pass ``bos_token=...`` as extra keywords when it uses them);
* an existing local path: a Hugging Face directory, a ``.gguf`` file, a ``.jinja`` file, a ``tokenizer_config.json``
  or ``chat_template.json`` file (see below);
* a packaged model's name (``"smollm2-135m-instruct"``: the packaged GGUF's template);
* a Hugging Face Hub id (``org/name``): only its template files are fetched (``tokenizer_config.json``,
  ``special_tokens_map.json``, ``chat_template.jinja``, ``chat_template.json``, ``additional_chat_templates/``).

A directory is read where transformers reads it: ``chat_template.jinja`` (the default template) and
``additional_chat_templates/<name>.jinja`` (named ones) first; else the legacy ``chat_template.json``
(``{"chat_template": ...}``); else ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of
``{"name", "template"}``); else the one ``.gguf`` file the directory holds. Special tokens come from
``tokenizer_config.json`` (strings or ``{"content": ...}`` dicts), with ``special_tokens_map.json`` filling the
ones it lacks. A GGUF file holds its template under ``tokenizer.chat_template`` (named ones under
``tokenizer.chat_template.<name>``, listed in ``tokenizer.chat_templates``) and its special tokens as ids into
``tokenizer.ggml.tokens``.

With several named templates, one is chosen as transformers does: ``template_name`` when given, else ``"tool_use"``
when ``tools`` are passed and the checkpoint has one, else ``"default"``.

``load_tokenizer`` returns a bare ``tokenizers.Tokenizer``, which keeps no template: pass the model's path (or the
template) here, and ``chat_template=`` to ``generate_text(..., messages=...)``.

Every bad input raises :class:`ChatTemplateError` (a ValueError) with one message: no template where the source
was looked at (the places named), a malformed message, a template that does not parse, or one that fails while
rendering (its own ``raise_exception`` message passed through). A path that does not exist (and is no packaged name
or Hub id) raises FileNotFoundError.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Mapping, Sequence

from flaxzoo.models.io.chat_render import (ChatTemplateError, checked_messages, checked_tools, compile_template, failure,
                                        plain_data, tracking_generation)

__all__ = ["CHAT_TEMPLATE_FILES", "SPECIAL_TOKEN_NAMES", "ChatTemplate", "ChatTemplateError", "apply_chat_template",
           "is_template_text", "load_chat_template", "plain_data"]

# The special tokens a template sees, as Hugging Face tokenizers name them.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# A GGUF's id keys (after "tokenizer.ggml.") of those tokens; llama.cpp spells "separator" "seperator".
GGUF_TOKEN_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                  "sep_token": "seperator_token_id", "pad_token": "padding_token_id", "cls_token": "cls_token_id",
                  "mask_token": "mask_token_id"}
# Where a Hugging Face directory keeps templates, in the order they are looked for.
JINJA_FILE, NAMED_DIR, LEGACY_JSON, TOKENIZER_CONFIG = ("chat_template.jinja", "additional_chat_templates",
                                                        "chat_template.json", "tokenizer_config.json")
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
CHAT_TEMPLATE_FILES = (JINJA_FILE, f"{NAMED_DIR}/*.jinja", LEGACY_JSON, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP)
GGUF_TEMPLATE_KEY = "tokenizer.chat_template"
TEMPLATE_MARKERS = ("{{", "{%", "{#")
DEFAULT_NAME, TOOL_USE_NAME = "default", "tool_use"


# ------------------------------------------------------------------------------------------------ the template
@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """A checkpoint's chat template(s) and special tokens.

    Attributes:
      templates: ``{name: Jinja text}``; a checkpoint with one template has it under ``"default"``.
      special_tokens: ``{"bos_token": "<s>", ...}``: the tokens of :data:`SPECIAL_TOKEN_NAMES` it names.
      origin: where the template was read (for messages).
    """

    templates: Mapping[str, str]
    special_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)
    origin: str = "given as text"

    @property
    def names(self) -> list[str]:
        return sorted(self.templates)

    def select(self, name: str | None = None, *, tools: Sequence[Any] | None = None) -> str:
        """The template text to render: ``name``'s; else ``"tool_use"``'s when ``tools`` are given and there is
        one; else ``"default"``'s."""
        if name is not None:
            if name not in self.templates:
                raise ChatTemplateError(f"no chat template named {name!r} ({self.origin}); there are {self.names}")
            return self.templates[name]
        if tools is not None and TOOL_USE_NAME in self.templates:
            return self.templates[TOOL_USE_NAME]
        if DEFAULT_NAME in self.templates:
            return self.templates[DEFAULT_NAME]
        raise ChatTemplateError(f"no chat template named 'default' ({self.origin}): pass template_name= (one of "
                                f"{self.names})")

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, template_name: str | None = None,
               **extra: Any) -> str:
        """``messages`` rendered with the selected template (see :func:`apply_chat_template`)."""
        return self.render_with_generation_spans(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                                 template_name=template_name, **extra)[0]

    def render_with_generation_spans(self, messages: Sequence[Mapping[str, Any]], *,
                                     add_generation_prompt: bool = False,
                                     tools: Sequence[Mapping[str, Any]] | None = None,
                                     template_name: str | None = None,
                                     **extra: Any) -> tuple[str, list[tuple[int, int]]]:
        """``(text, spans)``: :meth:`render`'s text and the ``[start, end)`` character spans of the template's
        ``{% generation %}`` blocks in it (none when the template has no such block), found as transformers'
        ``apply_chat_template(..., return_assistant_tokens_mask=True)`` finds them. Training text by default
        (``add_generation_prompt=False``)."""
        chat = checked_messages(messages)
        schemas = checked_tools(tools)
        compiled = compile_template(self.select(template_name, tools=schemas), self.origin)
        variables = {**self.special_tokens, "documents": None, **plain_data(extra)}
        variables.update(messages=chat, tools=schemas, add_generation_prompt=bool(add_generation_prompt))
        pieces: list[str] = []
        spans: list[tuple[int, int]] = []
        try:
            with tracking_generation(pieces, spans):
                for piece in compiled.generate(**variables):  # streamed: a span starts where the text so far ends
                    pieces.append(piece)
        except Exception as exc:  # a template runs arbitrary (sandboxed) logic: any failure is the template's
            raise ChatTemplateError(f"the chat template ({self.origin}) failed: {failure(exc)}") from exc
        return "".join(pieces), spans


# ---------------------------------------------------------------------------------------------------- finding


def is_template_text(source: Any) -> bool:
    """True for a string holding a Jinja delimiter (``{{``, ``{%``, ``{#``): template text, never a path."""
    return isinstance(source, str) and any(marker in source for marker in TEMPLATE_MARKERS)


def token_text(value: Any) -> str | None:
    """A special token as a config stores it: a string, or a dict with its ``content`` (an ``AddedToken``)."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def read_json(file: pathlib.Path) -> dict[str, Any]:
    """A JSON object from ``file``; ChatTemplateError naming the file when it is not one."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ChatTemplateError(f"cannot read {file}: {exc}") from exc
    if not isinstance(data, dict):
        raise ChatTemplateError(f"{file} holds a JSON {type(data).__name__}, not an object")
    return data


def named_templates(value: Any, where: str) -> dict[str, str]:
    """A stored ``chat_template`` value (text, or a list of ``{"name", "template"}``) as ``{name: text}``."""
    if isinstance(value, str):
        return {DEFAULT_NAME: value}
    if isinstance(value, Sequence) and all(isinstance(v, Mapping) and isinstance(v.get("name"), str)
                                           and isinstance(v.get("template"), str) for v in value):
        return {v["name"]: v["template"] for v in value}
    raise ChatTemplateError(f"{where}: chat_template must be text or a list of {{'name', 'template'}}; got "
                            f"{type(value).__name__}")


def directory_special_tokens(folder: pathlib.Path) -> dict[str, str]:
    """The special tokens ``tokenizer_config.json`` names, ``special_tokens_map.json`` filling the others."""
    tokens: dict[str, str] = {}
    for name in (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP):
        file = folder / name
        if file.is_file():
            data = read_json(file)
            for key in SPECIAL_TOKEN_NAMES:
                text = token_text(data.get(key))
                if text is not None:
                    tokens.setdefault(key, text)
    return tokens


def template_from_directory(folder: pathlib.Path) -> ChatTemplate:
    """The template(s) of a Hugging Face directory, looked for in the order the module docstring gives."""
    templates: dict[str, str] = {}
    if (folder / JINJA_FILE).is_file():
        templates[DEFAULT_NAME] = (folder / JINJA_FILE).read_text(encoding="utf-8")
    if (folder / NAMED_DIR).is_dir():
        templates.update({f.name.removesuffix(".jinja"): f.read_text(encoding="utf-8")
                          for f in sorted((folder / NAMED_DIR).glob("*.jinja"))})
    for name in (LEGACY_JSON, TOKENIZER_CONFIG):
        if not templates and (folder / name).is_file():
            value = read_json(folder / name).get("chat_template")
            if value is not None:
                templates = named_templates(value, str(folder / name))
    if templates:
        return ChatTemplate(templates, directory_special_tokens(folder), str(folder))
    ggufs = sorted(folder.glob("*.gguf"))
    if len(ggufs) == 1:
        return template_from_gguf(ggufs[0])
    looked = ", ".join((JINJA_FILE, f"{NAMED_DIR}/*.jinja", f"{LEGACY_JSON} (chat_template)",
                        f"{TOKENIZER_CONFIG} (chat_template)", "a single *.gguf file (tokenizer.chat_template)"))
    several = f"; it holds {len(ggufs)} .gguf files: pass the path of one" if len(ggufs) > 1 else ""
    raise ChatTemplateError(f"no chat template found in {folder}: looked for {looked}{several}")


def template_from_gguf(path: pathlib.Path) -> ChatTemplate:
    """The template(s) and special tokens in a GGUF file's metadata."""
    from flaxzoo.models.io.gguf import GGUFFile

    file = GGUFFile(path)
    templates: dict[str, str] = {}
    if isinstance(file.get(GGUF_TEMPLATE_KEY), str):
        templates[DEFAULT_NAME] = file.get(GGUF_TEMPLATE_KEY)
    for name in file.get(GGUF_TEMPLATE_KEY + "s") or []:
        text = file.get(f"{GGUF_TEMPLATE_KEY}.{name}")
        if isinstance(text, str):
            templates[name] = text
    if not templates:
        raise ChatTemplateError(f"no chat template found in {file.path}: its metadata has no {GGUF_TEMPLATE_KEY} "
                                f"(nor {GGUF_TEMPLATE_KEY}s with {GGUF_TEMPLATE_KEY}.<name>)")
    vocabulary = file.get("tokenizer.ggml.tokens") or []
    tokens = {}
    for name, key in GGUF_TOKEN_IDS.items():
        index = file.get(f"tokenizer.ggml.{key}")
        if isinstance(index, int) and 0 <= index < len(vocabulary):
            tokens[name] = vocabulary[index]
    return ChatTemplate(templates, tokens, str(file.path))


def template_from_file(path: pathlib.Path) -> ChatTemplate:
    """A GGUF file, a ``.jinja`` file (special tokens from its folder's config) or a tokenizer config file."""
    from flaxzoo.models.io.gguf import is_gguf

    if path.suffix == ".gguf" or is_gguf(path):
        return template_from_gguf(path)
    if path.suffix == ".jinja":
        return ChatTemplate({DEFAULT_NAME: path.read_text(encoding="utf-8")}, directory_special_tokens(path.parent),
                            str(path))
    if path.name in (TOKENIZER_CONFIG, LEGACY_JSON):
        value = read_json(path).get("chat_template")
        if value is None:
            raise ChatTemplateError(f"no chat template found in {path}: it has no chat_template entry")
        tokens = directory_special_tokens(path.parent) if path.name == TOKENIZER_CONFIG else {}
        return ChatTemplate(named_templates(value, str(path)), tokens, str(path))
    raise ChatTemplateError(f"{path} is a file that holds no chat template: pass a Hugging Face directory, a .gguf "
                            f"file, a .jinja file, a {TOKENIZER_CONFIG} or a {LEGACY_JSON}")


def template_from_hub(repo_id: str, revision: str | None) -> ChatTemplate:
    """Fetch only the template files of a Hub repository (the Hugging Face cache; offline, a cached copy)."""
    try:
        import huggingface_hub
    except ImportError as exc:
        raise ImportError(f"{repo_id!r} is not a local path; fetching its chat template needs huggingface_hub") from exc
    patterns = [JINJA_FILE, f"{NAMED_DIR}/*.jinja", LEGACY_JSON, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP]
    try:
        folder = huggingface_hub.snapshot_download(repo_id, revision=revision, allow_patterns=patterns)
    except Exception as exc:  # offline and not cached, unknown or gated repository, network failure
        raise FileNotFoundError(f"{repo_id!r} is not a local path, and its chat template could not be fetched from "
                                f"the Hugging Face Hub ({type(exc).__name__}: {exc}); pass a local path or the "
                                "template text") from exc
    return template_from_directory(pathlib.Path(folder))


def load_chat_template(source: ChatTemplate | str | os.PathLike, *, revision: str | None = None) -> ChatTemplate:
    """The chat template(s) and special tokens ``source`` names (see the module docstring for the order); a Hub
    id's ``revision`` (branch, tag or commit)."""
    from flaxzoo.models.io.files import is_hub_id
    from flaxzoo.models.io.packaged import packaged_path

    if isinstance(source, ChatTemplate):
        return source
    if is_template_text(source):
        return ChatTemplate({DEFAULT_NAME: source})
    if not isinstance(source, (str, os.PathLike)):
        raise ChatTemplateError(
            f"a {type(source).__name__} carries no chat template (load_tokenizer's tokenizers keep none): pass the "
            "model's Hugging Face directory, GGUF file, packaged name or Hub id, or the template text")
    path = pathlib.Path(os.path.expanduser(os.fspath(source)))
    if not path.exists() and isinstance(source, str):
        packaged = packaged_path(source)
        if packaged is not None:
            path = packaged
        elif is_hub_id(source):
            return template_from_hub(source, revision)
    if path.is_dir():
        return template_from_directory(path.absolute())
    if path.is_file():
        return template_from_file(path.absolute())
    raise FileNotFoundError(f"{str(source)!r} is not a chat template (it has none of {list(TEMPLATE_MARKERS)}), an "
                            "existing path, a packaged model's name or a Hugging Face Hub id")


def apply_chat_template(source: ChatTemplate | str | os.PathLike, messages: Sequence[Mapping[str, Any]], *,
                        add_generation_prompt: bool = True, tools: Sequence[Mapping[str, Any]] | None = None,
                        template_name: str | None = None, **extra: Any) -> str:
    """``messages`` rendered with the chat template of ``source``, as Hugging Face's
    ``tokenizer.apply_chat_template(messages, tokenize=False, ...)`` renders them.

    Args:
      source: a :class:`ChatTemplate`, the template text, or where to find it: a Hugging Face directory, a GGUF
        file, a packaged model's name, a Hub id (see the module docstring).
      messages: ``[{"role": "system" | "user" | "assistant" | "tool", "content": ...}, ...]``; other keys
        (``tool_calls``, ``name`` ...) reach the template as they are.
      add_generation_prompt: end with the header that opens the assistant's reply (the prompt to generate from);
        False for a finished conversation (training text).
      tools: JSON schemas of the functions the model may call (the template decides how it shows them).
      template_name: which of several named templates (default: ``"tool_use"`` with tools when there is one, else
        ``"default"``).
      extra: more template variables (``enable_thinking=False``, ``documents=[...]``, ``bos_token=...``); they win
        over the checkpoint's special tokens.

    Raises ChatTemplateError (see the module docstring); FileNotFoundError for a source that names nothing.
    """
    return load_chat_template(source).render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                             template_name=template_name, **extra)
