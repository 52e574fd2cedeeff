"""Rendering a chat template as transformers renders it: the sandboxed Jinja environment (``environment``: jinja2's
``ImmutableSandboxedEnvironment`` with ``trim_blocks`` / ``lstrip_blocks``, ``loopcontrols``, transformers'
``tojson``, ``raise_exception`` and ``strftime_now``, the ``{% generation %}`` block), the checks of the messages and
tools a template is given, and one-line errors (:class:`ChatTemplateError`). Where templates come from, and the
template object, are :mod:`flaxzoo.models.io.chat`'s.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
from datetime import datetime
from typing import Any, Callable, Mapping, Sequence

# Alternative names of a message's reasoning; templates read the first.
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """A chat template that cannot be found, parsed or rendered, or messages it cannot take."""


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
        body unchanged, and inside :func:`tracking_generation` records where the body lands in the rendered text."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("body"), [], [], body).set_lineno(lineno)

        def body(self, caller: Callable[[], str]) -> str:
            text = caller()
            tracked = GENERATION_TRACKER.get()
            if tracked is not None:
                pieces, spans = tracked
                start = sum(map(len, pieces))
                spans.append((start, start + len(text)))
            return text

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=DictMaker(),
                       namespace=SafeNamespace)
    return env


# (the pieces a streamed render has produced so far, the spans found) while :func:`tracking_generation` runs
GENERATION_TRACKER: contextvars.ContextVar[tuple[list[str], list[tuple[int, int]]] | None] = contextvars.ContextVar(
    "generation_tracker", default=None)


@contextlib.contextmanager
def tracking_generation(pieces: list[str], spans: list[tuple[int, int]]):
    """Within the block, a template streamed into ``pieces`` (``compiled.generate``) appends to ``spans`` the
    ``[start, end)`` character span of each ``{% generation %}`` body: where the text rendered before it ends, as
    transformers' ``return_assistant_tokens_mask`` finds them."""
    if GENERATION_TRACKER.get() is not None:
        raise RuntimeError("tracking_generation does not nest")
    token = GENERATION_TRACKER.set((pieces, spans))
    try:
        yield
    finally:
        GENERATION_TRACKER.reset(token)


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
