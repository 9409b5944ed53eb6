"""`dapo config`: every setting of a recipe as a dotted key, with its default, its value and a one-line doc.

The docs are the attribute docstrings of the dataclasses in `dapo_rl.config` (the string literal under each field,
as CleanRL and TRL document their arguments), read from that module's source with `ast`. A field without one
borrows its class's docstring when it is a section (`algorithm.overlong_buffer`), a list of sections
(`algorithm.campo.stages`) or the section's on/off switch (`enable`).
"""

from __future__ import annotations

import ast
import inspect
import re
import typing
from dataclasses import dataclass, fields, is_dataclass
from functools import cache
from typing import Any

import yaml

from dapo_rl import config as config_module
from dapo_rl.config import Config, ConfigError


@cache
def field_docs() -> dict[tuple[str, str], str]:
    """The attribute docstrings of the dataclasses in `dapo_rl.config`: `(class name, field name) -> doc`.

    A field's doc is the string literal right under it; fields without one are absent. Empty when the module's
    source cannot be read (a build without `.py` files).
    """
    try:
        tree = ast.parse(inspect.getsource(config_module))
    except (OSError, TypeError):
        return {}
    docs: dict[tuple[str, str], str] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        body = node.body
        for stmt, after in zip(body, body[1:]):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[(node.name, stmt.target.id)] = inspect.cleandoc(after.value.value)
    return docs


_ABBREVIATIONS = ("e.g.", "i.e.", "vs.", "cf.", "et al.", "approx.")


def one_line(doc: str) -> str:
    """The first sentence of a doc, on one line: up to the first `.` that ends a sentence (outside parentheses
    and brackets, before a capital letter or the end; `e.g.` and the like do not end one)."""
    text = " ".join(doc.split())
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(depth - 1, 0)
        elif ch == "." and depth == 0:
            rest = text[i + 1 :]
            if rest and not (rest[0] == " " and rest[1:2].isupper()):
                continue
            if text[: i + 1].lower().endswith(_ABBREVIATIONS):
                continue
            return text[: i + 1]
    return text


def _class_doc(cls: type) -> str:
    return (
        inspect.cleandoc(cls.__doc__ or "")
        if cls.__doc__ and not cls.__doc__.startswith(cls.__name__)
        else ""
    )


def _list_item_type(cls: type, name: str) -> type | None:
    """The dataclass of a `list[SomeConfig]` field (`algorithm.campo.stages`), else None."""
    hint = typing.get_type_hints(cls, vars(config_module)).get(name)
    args = typing.get_args(hint) if typing.get_origin(hint) is list else ()
    return args[0] if args and is_dataclass(args[0]) else None


def field_doc(cls: type, name: str) -> str:
    """The doc of field `name` of config dataclass `cls` (see the module docstring for what a field without its
    own docstring borrows); "" when there is none."""
    own = field_docs().get((cls.__name__, name))
    if own:
        return own
    f = {f.name: f for f in fields(cls)}[name]
    default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
    if is_dataclass(default):
        return _class_doc(type(default))
    item = _list_item_type(cls, name)
    if item is not None:
        doc = _class_doc(item)
        return f"A list, each item {doc[:1].lower() + doc[1:] if doc[1:2].islower() else doc}"
    if name == "enable":
        return f"Turn on: {_class_doc(cls)}"
    return ""


@dataclass
class ConfigRow:
    """One setting as `dapo config` shows it."""

    key: str
    """Dotted key, as overrides take it (`algorithm.clip_ratio_high`); list items as `stages[0].steps`."""
    default: Any
    """The dataclass default (`Config()`), or `MISSING_ITEM` for a list item the defaults do not have."""
    value: Any
    """The value in the loaded config (recipe and overrides applied), or `MISSING_ITEM` for no such item."""
    doc: str
    """The field's full doc ("" when undocumented)."""

    @property
    def changed(self) -> bool:
        """The recipe or the command line set a value other than the default (never for a list item's settings
        listed while the list is empty)."""
        return self.value is not MISSING_ITEM and self.value != self.default


MISSING_ITEM = "-"
"""Shown for a list item absent from the defaults (or from the loaded config)."""


def config_rows(cfg: Config) -> list[ConfigRow]:
    """Every leaf setting of `cfg` against the dataclass defaults, in field order.

    Sections recurse (`algorithm.overlong_buffer.len`); a list of sections (`algorithm.campo.stages`) gives a row for
    the list, then one per item and field (`algorithm.campo.stages[0].steps`, with the item dataclass's defaults),
    or, when the list is empty, one per field of the item dataclass (`algorithm.campo.stages[].steps`) so that its
    settings and docs are listed too.
    """
    rows: list[ConfigRow] = []

    def walk(cls: type, default: Any, value: Any, prefix: str) -> None:
        for f in fields(cls):
            key, d, v = f"{prefix}{f.name}", getattr(default, f.name), getattr(value, f.name)
            if is_dataclass(d):
                walk(type(d), d, v, key + ".")
                continue
            rows.append(ConfigRow(key, d, v, field_doc(cls, f.name)))
            item = _list_item_type(cls, f.name)
            if item is None:
                continue
            count = max(len(d), len(v))
            if count == 0:
                blank = item()
                for g in fields(item):
                    doc = field_doc(item, g.name)
                    rows.append(ConfigRow(f"{key}[].{g.name}", getattr(blank, g.name), MISSING_ITEM, doc))
            for i in range(count):
                di = d[i] if i < len(d) else item()
                vi = v[i] if i < len(v) else None
                for g in fields(item):
                    val = getattr(vi, g.name) if vi is not None else MISSING_ITEM
                    rows.append(
                        ConfigRow(f"{key}[{i}].{g.name}", getattr(di, g.name), val, field_doc(item, g.name))
                    )

    walk(Config, Config(), cfg, "")
    return rows


def format_value(value: Any) -> str:
    """A value as a recipe or an override writes it: `null`, `true`, `0.28`, `""`, `[console, jsonl]`,
    `{min_terms: 2}`; a list of sections as `[N items]`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, (list, tuple)) and value and is_dataclass(value[0]):
        return f"[{len(value)} item{'s' if len(value) != 1 else ''}]"
    if isinstance(value, (list, tuple, dict)):
        return yaml.safe_dump(
            list(value) if isinstance(value, tuple) else value, default_flow_style=True, width=10**6
        ).strip()
    return str(value)


def select_rows(rows: list[ConfigRow], pattern: str | None) -> list[ConfigRow]:
    """The rows whose key or one-line doc matches the regular expression `pattern` (case-insensitive); all rows
    when `pattern` is None.

    Raises:
        ConfigError: `pattern` is not a valid regular expression.
    """
    if pattern is None:
        return rows
    try:
        rx = re.compile(pattern, re.IGNORECASE)
    except re.error as e:
        raise ConfigError(f"--grep {pattern!r} is not a valid regular expression: {e}") from e
    return [r for r in rows if rx.search(r.key) or rx.search(one_line(r.doc))]


def format_rows(rows: list[ConfigRow]) -> str:
    """Aligned lines `M KEY VALUE DEFAULT DOC` under a header: `M` is `*` where the value differs from the default,
    DOC the first sentence of the field's doc."""
    table = [("", "KEY", "VALUE", "DEFAULT", "DOC")]
    table += [
        ("*" if r.changed else "", r.key, format_value(r.value), format_value(r.default), one_line(r.doc))
        for r in rows
    ]
    # long values (dicts, lists) do not widen every row: columns fit the values up to 24 characters
    widths = [
        max(len(t[c]) for t in table) if c < 2 else min(max(len(t[c]) for t in table), 24) for c in range(4)
    ]
    lines = []
    for t in table:
        cells = [t[c].ljust(widths[c]) for c in range(4)]
        lines.append(("  ".join(cells) + "  " + t[4]).rstrip())
    return "\n".join(lines)
