"""Chat templates: a conversation (a list of ``{"role": ..., "content": ...}`` messages) rendered into the one prompt
string an instruct model was trained on, with the Jinja template its checkpoint carries.

``apply_chat_template(source, messages)`` renders as Hugging Face's ``tokenizer.apply_chat_template(messages,
tokenize=False)`` does: the same sandboxed Jinja environment (jinja2's ``ImmutableSandboxedEnvironment`` with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter that leaves non-ASCII text
and ``<>&`` as they are and takes ``indent`` / ``separators`` / ``sort_keys``, the globals ``raise_exception`` and
``strftime_now``, a ``{% generation %}`` block that renders its body) and the same variables: ``messages``,
``add_generation_prompt``, ``tools``, ``documents`` (None unless given), the checkpoint's special tokens
(``bos_token``, ``eos_token``, ``unk_token``, ``sep_token``, ``pad_token``, ``cls_token``, ``mask_token``; those it
names) and any extra keyword, which wins over a special token of the same name. As there, message keys whose value
is None are dropped before rendering, and a message's reasoning under ``thinking`` / ``reasoning`` is also offered
as ``reasoning_content`` (and the other way round).

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
import functools
import json
import os
import pathlib
from datetime import datetime
from typing import Any, Callable, Mapping, Sequence

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
# Alternative names of a message's reasoning; templates read the first.
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """A chat template that cannot be found, parsed or rendered, or messages it cannot take."""


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
        chat = checked_messages(messages)
        schemas = checked_tools(tools)
        text = self.select(template_name, tools=schemas)
        compiled = compile_template(text, self.origin)
        variables = {**self.special_tokens, "documents": None, **plain_data(extra)}
        variables.update(messages=chat, tools=schemas, add_generation_prompt=bool(add_generation_prompt))
        try:
            return compiled.render(**variables)
        except Exception as exc:  # a template runs arbitrary (sandboxed) logic: any failure is the template's
            raise ChatTemplateError(f"the chat template ({self.origin}) failed: {failure(exc)}") from exc


def failure(exc: BaseException) -> str:
    """One line about a Jinja failure: the template's own message for ``raise_exception``, else the error's type and
    message (with the template line when Jinja knows it)."""
    import jinja2

    if type(exc) is jinja2.TemplateError:  # raise_exception(...) and nothing else raises the base class
        return str(exc)
    line = getattr(exc, "lineno", None)
    return f"{type(exc).__name__}: {exc}" + (f" (template line {line})" if line else "")


# ------------------------------------------------------------------------------------------------- the inputs
def plain_data(value: Any) -> Any:
    """``value`` rebuilt from plain JSON-like types before a template sees it: mappings as dicts, lists and tuples
    as themselves, ``str`` / ``int`` / ``float`` subclasses (enums, numpy scalars) as the base type; anything else
    (arrays, images, objects with methods the sandbox cannot judge) becomes the placeholder ``"<TypeName>"``."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(plain_data(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):  # numpy scalars
        return plain_data(value.item())
    for kind, plain in ((str, str.__str__), (int, int.__int__), (float, float.__float__)):
        if isinstance(value, kind):  # a subclass (an enum member ...): its plain value
            return plain(value)
    return f"<{type(value).__name__}>"


def checked_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as plain dicts without None values, each checked: a mapping with a string ``role`` and a
    ``content`` (an assistant message that only calls tools, ``tool_calls``, may lack it); reasoning offered under
    each of :data:`REASONING_KEYS`."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise ChatTemplateError(f"messages must be a list of {{'role', 'content'}} mappings; got "
                                f"{type(messages).__name__}")
    if not messages:
        raise ChatTemplateError("messages is empty: a chat template needs at least one message")
    chat = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"message {i} is a {type(message).__name__}, not a mapping with 'role' and "
                                    "'content'")
        kept = {key: value for key, value in plain_data(message).items() if value is not None}
        if not isinstance(kept.get("role"), str):
            raise ChatTemplateError(f"message {i} has no 'role' string (its keys: {sorted(map(str, message))})")
        if "content" not in kept and "tool_calls" not in kept:
            raise ChatTemplateError(f"message {i} ({kept['role']}) has no 'content' (its keys: "
                                    f"{sorted(map(str, message))})")
        reasoning = next((kept[key] for key in REASONING_KEYS if key in kept), None)
        if reasoning is not None:
            kept = {"thinking": reasoning, **kept, "reasoning_content": reasoning}
        chat.append(kept)
    return chat


def checked_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """``tools`` as plain data: JSON schemas (mappings, e.g. ``{"type": "function", "function": {...}}``)."""
    if tools is None:
        return None
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ChatTemplateError(f"tools must be a list of JSON schemas (mappings); got {type(tools).__name__}")
    bad = [i for i, tool in enumerate(tools) if not isinstance(tool, Mapping)]
    if bad:
        raise ChatTemplateError(f"tools {bad} are not JSON schemas (mappings): pass each tool as its schema, "
                                "e.g. {'type': 'function', 'function': {'name': ..., 'parameters': ...}}")
    return [plain_data(tool) for tool in tools]


# ---------------------------------------------------------------------------------------- the Jinja environment
def raise_exception(message: str) -> None:
    """A template's way to refuse its input: the message reaches the caller in :class:`ChatTemplateError`."""
    import jinja2

    raise jinja2.TemplateError(message)


def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
           sort_keys: bool = False) -> str:
    """JSON text as ``json.dumps`` writes it (Jinja's own filter escapes ``<``, ``>``, ``&`` and ``'``, which chat
    templates must not)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt: str) -> str:
    """The local time now, formatted (templates that state today's date)."""
    return datetime.now().strftime(fmt)


class DictMaker:
    """The ``dict`` global: builds dicts (``dict(a=1)``, ``dict.fromkeys(...)``) without handing the template the
    ``dict`` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Any, value: Any = None) -> dict:
        return dict.fromkeys(keys, value)


@functools.lru_cache(maxsize=1)
def environment() -> Any:
    """The one sandboxed Jinja environment every template compiles in (built on first use)."""
    try:
        import jinja2
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as exc:
        raise ImportError("chat templates need jinja2: pip install 'jinja2>=3.1.6'") from exc

    class SafeNamespace(jinja2.utils.Namespace):
        """``namespace(...)`` that refuses attribute names starting with ``_`` (no reaching into internals)."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            values = dict(*rest, **kwargs)
            for name in values:
                SafeNamespace.check(name)
            jinja2.utils.Namespace.__init__(self, values)

        def __setitem__(self, name: str, value: Any) -> None:
            SafeNamespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_': {name!r}")

    class GenerationBlock(Extension):
        """``{% generation %}...{% endgeneration %}`` (marks the assistant's text for training masks): renders its
        body unchanged."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("body"), [], [], body).set_lineno(lineno)

        def body(self, caller: Callable[[], str]) -> str:
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=DictMaker(),
                       namespace=SafeNamespace)
    return env


@functools.lru_cache(maxsize=64)
def compiled_template(text: str) -> Any:
    """``text`` compiled in :func:`environment` (cached by text)."""
    return environment().from_string(text)


def compile_template(text: str, origin: str) -> Any:
    """:func:`compiled_template`, a syntax error reported as :class:`ChatTemplateError` naming ``origin``."""
    import jinja2

    if not isinstance(text, str):
        raise ChatTemplateError(f"the chat template ({origin}) is a {type(text).__name__}, not text")
    try:
        return compiled_template(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the chat template ({origin}) does not parse: {exc.message} (template line "
                                f"{exc.lineno})") from exc


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
    from flaxzoo.models.gguf import GGUFFile

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
    from flaxzoo.models.gguf import is_gguf

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
    from flaxzoo.models.hub.files import is_hub_id
    from flaxzoo.models.hub.packaged import packaged_path

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
