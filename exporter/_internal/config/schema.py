"""The config's keys, read from its definitions: type, default, bound and meaning of each.

One walk over the dataclasses of settings.py and the bounds of bounds.py gives every key the
loader accepts, with the type the loader converts to (the type of its default). From it come
the JSON Schema of the Helm chart's `config` value (`json_schema`, written into
`values.schema.json` by `ttft-exporter generate`) and docs/reference/config.md. A key's meaning
is the comment written beside its field (`#:` above it, or `#` after it), so it is said once.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, fields, is_dataclass
from functools import cache
from typing import Any

from .bounds import BOUNDS, Bound
from .settings import SLO, Config, Objective

#: The loader's type of a value, by the type of its default, as JSON Schema names it.
_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (tuple, "array"),
    (type(None), "null"))


@dataclass(frozen=True)
class Key:
    """One config key: `path` as the loader reports it (`slos[]` for every SLO entry)."""

    path: str
    type: str
    default: Any
    doc: str
    bound: Bound | None = None
    item_type: str = ""  # of an array's items
    item_bound: Bound | None = None


def json_type(value: Any) -> str:
    return next(name for cls, name in _JSON_TYPES if isinstance(value, cls))


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The comment of each field of a dataclass: the `#:` lines above it, else the `#` after."""
    out: dict[str, str] = {}
    pending: list[str] = []
    previous = ""  # the field on the line before, if any: one comment may cover both
    for line in inspect.getsource(cls).splitlines():
        text = line.strip()
        if text.startswith("#:"):
            pending.append(text[2:].strip())
            continue
        field = re.match(r"(\w+): [^=]+=", text)
        if field:
            trailing = re.search(r"\s#\s(.*)$", text)
            doc = " ".join(pending) or (trailing.group(1) if trailing else "")
            out[field.group(1)] = doc or (f"with `{previous}`, above" if previous else "")
        previous = field.group(1) if field else ""
        pending = []
    return out


def section_doc(cls: type) -> str:
    """The first paragraph of a section's docstring, on one line."""
    doc = inspect.getdoc(cls) or ""
    return " ".join(doc.split("\n\n", 1)[0].split()) if doc != inspect.getdoc(object) else ""


def keys() -> list[Key]:
    """Every key the loader accepts, in the order of the definitions."""
    out: list[Key] = []
    config = Config()
    docs = field_docs(Config)
    for top in fields(Config):
        value = getattr(config, top.name)
        if top.name == "slos":
            # One entry of defaults: `slos: [{}]`.
            out.append(Key("slos", "array", ({},), docs["slos"], Bound(min_length=1), "object"))
            out.extend(_keys_of(SLO(), "slos[]"))
        elif is_dataclass(value):
            out.extend(_keys_of(value, top.name))
        else:
            out.append(_key(top.name, value, docs.get(top.name, "")))
    return out


def _keys_of(obj: Any, prefix: str) -> list[Key]:
    out = []
    docs = field_docs(type(obj))
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, Objective):
            out.extend(_key(f"{prefix}.{f.name}.{g.name}", getattr(value, g.name),
                            field_docs(Objective)[g.name]) for g in fields(value))
        else:
            out.append(_key(f"{prefix}.{f.name}", value, docs.get(f.name, "")))
    return out


def _key(path: str, default: Any, doc: str) -> Key:
    item_type = ""
    if isinstance(default, tuple):
        # The loader converts items to the type of the default's first (strings when empty).
        item_type = json_type(default[0]) if default else "string"
    return Key(path, json_type(default), default, doc, BOUNDS.get(path), item_type,
               BOUNDS.get(f"{path}[]"))


def json_schema() -> dict[str, Any]:
    """JSON Schema (draft-07) of a config: every key with its type and bound; no other key."""
    root: dict[str, Any] = _object()
    for key in keys():
        node = root
        parts = key.path.split(".")
        for part in parts[:-1]:
            if part.endswith("[]"):
                array = node["properties"].setdefault(part[:-2], {"type": "array"})
                node = array.setdefault("items", {})
                for name, value in _object().items():
                    node.setdefault(name, value)
            else:
                node = node["properties"].setdefault(part, _object())
        leaf = node["properties"].setdefault(parts[-1], {})
        leaf.update(_leaf(key))
    return root


def _object() -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": {}}


def _leaf(key: Key) -> dict[str, Any]:
    out: dict[str, Any] = {"type": key.type}
    if key.doc:
        out["description"] = key.doc
    if key.bound:
        out.update(key.bound.json_schema())
        if key.bound.min_length:
            out["minItems" if key.type == "array" else "minLength"] = key.bound.min_length
    if key.type == "array":
        item = {"type": key.item_type}
        if key.item_bound:
            item.update(key.item_bound.json_schema())
        out.setdefault("items", {}).update(item)
    return out
