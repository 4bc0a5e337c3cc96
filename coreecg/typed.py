"""Typed YAML: dataclass trees read from YAML files, dicts and `a.b=c` overrides, with errors in
one style, "<origin>: <dotted.key>: <reason>" (origin: the file, or where the values came from).
The config (`coreecg.config`), study files (`coreecg.study.spec`) and search spaces
(`coreecg.tune.spaces`) are read by it.

    cfg = load(Config, read_yaml(path, ConfigError), origin=str(path), error=ConfigError)
    cfg = load(cfg, override(Config, "optim.lr=3e-4", ConfigError), origin="overrides", error=ConfigError)

`load` builds a dataclass type from its defaults, or layers onto an instance (only the keys given
change; each section's `__post_init__` validates it again, and its error is prefixed with the
section's dotted key unless it starts with it). Keys are applied in the order the dataclass
declares them. Field types: bool, int, float (YAML reads "3e-4" as a string: accepted), str
(numbers keep their text), None, Literal, unions (Optional), tuple[T, ...] and fixed tuples
(from lists), dict[str, T], nested dataclasses, Any, `Annotated[T, Check(...)]` and `OpenSection`
(sections named at load time: `methods.<name>`). Unknown keys, wrongly typed values and missing
required keys are errors naming the dotted key.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

import yaml


class TypedError(ValueError):
    """A key or value a typed file cannot take (ConfigError, StudyError and SpaceError are kinds of it)."""


@dataclass(frozen=True)
class Check:
    """A rule on a field's value: `Annotated[T, Check(test, "must be ...")]`, test(value) -> bool."""

    test: Callable[[Any], bool]
    reason: str


class OpenSection:
    """A section whose keys name sub-sections resolved when read (`methods.<name>`: one options
    dataclass per registered method). A sub-section not set holds its dataclass's defaults."""

    unknown_reason = "no section of that name"

    def __init__(self, sections: dict[str, Any] | None = None):
        self._sections = dict(sections or {})

    @classmethod
    def section_type(cls, name: str) -> type | None:
        """The dataclass of sub-section `name` (None: no such sub-section)."""
        raise NotImplementedError

    @classmethod
    def known(cls) -> list[str]:
        """The sub-section names an error lists."""
        return []

    def names(self) -> list[str]:
        """The sub-sections written out: those set."""
        return list(self._sections)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._sections:
            return self._sections[name]
        tp = self.section_type(name)
        if tp is None:
            raise AttributeError(f"no section {name!r}")
        return tp()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and to_plain(self) == to_plain(other)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({to_plain(self)})"


# ---------------------------------------------------------------------------- reading


def read_yaml(path: str | Path, error: type[TypedError] = TypedError) -> dict[str, Any]:
    """The mapping a YAML file holds (an empty file: {}); `error` naming the file otherwise."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise error(f"{path}: cannot read: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def load(target: Any, data: Any, *, origin: str, error: type[TypedError] = TypedError) -> Any:
    """`data` (a mapping) onto `target`: a dataclass type (built from its defaults) or an instance
    (only the keys given change). -> a new instance; `error` "<origin>: <key>: <reason>"."""
    if not isinstance(data, dict):
        raise error(f"{origin}: expected a mapping, got {data!r}")
    try:
        return _section(target, data, "")
    except ValueError as e:
        raise error(f"{origin}: {e}") from None


def override(schema: Any, item: str, error: type[TypedError] = TypedError, origin: str = "overrides"
             ) -> dict[str, Any]:
    """"a.b=value" -> {"a": {"b": value}}, the value read as YAML, except that a string field of
    `schema` keeps its text (YAML would read a trial id 19182_00000 as an int)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise error(f"override {item!r} is not of the form a.b=value")
    try:
        value: Any = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise error(f"{origin}: {key}: {raw.strip()!r} is not a YAML value "
                    f"({getattr(e, 'problem', None) or e})") from None
    tp = field_type(schema, key)
    union_of_str = typing.get_origin(tp) in (typing.Union, types.UnionType) and str in typing.get_args(tp)
    if value is not None and not isinstance(value, str) and (
            tp is str or (union_of_str and not isinstance(value, (list, dict)))):
        value = raw.strip()         # a str | list field (data.corpus): a scalar keeps its text too
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def field_type(schema: Any, dotted: str) -> Any:
    """The declared type of a dotted key in a dataclass tree (None: not a key of it)."""
    tp = schema if isinstance(schema, type) else type(schema)
    for part in dotted.split("."):
        if isinstance(tp, type) and issubclass(tp, OpenSection):
            tp = tp.section_type(part)
        elif dataclasses.is_dataclass(tp) and part in _fields(tp):
            tp = _bare(_hints(tp)[part])
        else:
            return None
        if tp is None:
            return None
    return tp


def to_plain(obj: Any) -> Any:
    """Dataclasses, open sections and tuples as dicts and lists (what YAML writes)."""
    if isinstance(obj, OpenSection):
        return {name: to_plain(getattr(obj, name)) for name in obj.names()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, (tuple, list)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


# ---------------------------------------------------------------------------- the engine


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init]


def _bare(tp: Any) -> Any:
    """Annotated[T, ...] -> T; Optional[T] -> T (the type a key names)."""
    if typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _bare(args[0])
    return tp


def _section(target: Any, data: dict, prefix: str) -> Any:
    """A dataclass section from `data`: `target` a type (defaults) or an instance (layered onto)."""
    cls = target if isinstance(target, type) else type(target)
    names = _fields(cls)
    unknown = [str(k) for k in data if k not in names]
    if unknown:
        where = prefix.rstrip(".") or "top-level"
        raise TypedError(f"{', '.join(prefix + u for u in unknown)}: unknown key{'s' * (len(unknown) > 1)}; "
                         f"the {where} keys are {', '.join(sorted(names))}")
    hints = _hints(cls)
    changes = {name: _value(data[name], hints[name], prefix + name, None if isinstance(target, type)
                            else getattr(target, name)) for name in names if name in data}
    if isinstance(target, type):
        required = [f.name for f in dataclasses.fields(cls) if f.init and f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING and f.name not in changes]
        if required:
            raise TypedError(f"{', '.join(prefix + r for r in required)}: required")
    try:
        return cls(**changes) if isinstance(target, type) else dataclasses.replace(target, **changes)
    except TypedError as e:
        raise _in_section(prefix, e) from None
    except ValueError as e:        # a plugin's own check may raise a plain ValueError
        raise _in_section(prefix, TypedError(str(e))) from None


def _in_section(prefix: str, e: Exception) -> Exception:
    """A section's own validation error, prefixed with its dotted key unless it starts with it."""
    key = prefix.rstrip(".")
    if not key or re.match(rf"({re.escape(key)}|{re.escape(key.rsplit('.', 1)[-1])})\b", str(e)):
        return e
    return type(e)(f"{key}: {e}")


def _value(value: Any, tp: Any, key: str, current: Any = None) -> Any:
    """`value` as type `tp` at `key`; `current`: the section it layers onto (or None)."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *rules = typing.get_args(tp)
        out = _value(value, base, key, current)
        for rule in rules:
            if isinstance(rule, Check) and not rule.test(out):
                raise TypedError(f"{key}: {rule.reason}, got {value!r}")
        return out
    if isinstance(tp, type) and issubclass(tp, OpenSection):
        return _open(current if isinstance(current, tp) else tp(), _mapping(value, key), key)
    if dataclasses.is_dataclass(tp):
        return _section(current if isinstance(current, tp) else tp, _mapping(value, key), key + ".")
    if tp is Any:
        return value
    if origin is dict:
        vt = typing.get_args(tp)[1]
        return {str(k): _value(v, vt, f"{key}.{k}") for k, v in _mapping(value, key).items()}
    if origin in (typing.Union, types.UnionType):
        return _union(value, tp, key, current)
    if origin is tuple:
        return _tuple(value, tp, key)
    return _scalar(value, tp, key)


def _mapping(value: Any, key: str) -> dict:
    if not isinstance(value, dict):
        raise TypedError(f"{key}: a section; give it a mapping, not {value!r}")
    return value


def _open(section: OpenSection, data: dict, key: str) -> OpenSection:
    sections = dict(section._sections)
    for name, value in data.items():
        tp = section.section_type(str(name))
        if tp is None:
            raise TypedError(f"{key}.{name}: unknown key ({section.unknown_reason}); "
                             f"the {key} keys are {', '.join(section.known())}")
        sections[str(name)] = _value(value, tp, f"{key}.{name}", getattr(section, str(name)))
    return type(section)(sections)


def _shape(value: Any, tp: Any) -> bool:
    """Whether `value` has the shape of `tp` (mapping, list, null or scalar)."""
    tp = _bare(tp) if typing.get_origin(tp) is Annotated else tp
    mapping = dataclasses.is_dataclass(tp) or typing.get_origin(tp) is dict or \
        (isinstance(tp, type) and issubclass(tp, OpenSection))
    if isinstance(value, dict):
        return mapping
    if isinstance(value, (list, tuple)):
        return typing.get_origin(tp) is tuple
    if value is None:
        return tp is type(None)
    return not mapping and typing.get_origin(tp) is not tuple and tp is not type(None)


def _union(value: Any, tp: Any, key: str, current: Any) -> Any:
    args = [a for a in typing.get_args(tp) if _shape(value, a)] or list(typing.get_args(tp))
    errors = []
    for arg in args:
        try:
            return _value(value, arg, key, current)
        except TypedError as e:
            errors.append(e)
    if len(errors) == 1:
        raise errors[0]
    raise TypedError(f"{key}: expects {' or '.join(_describe(a) for a in typing.get_args(tp))}, got {value!r}")


def _tuple(value: Any, tp: Any, key: str) -> tuple:
    if not isinstance(value, (list, tuple)):
        raise TypedError(f"{key}: expects a list, got {value!r}")
    args = typing.get_args(tp)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_value(v, args[0], key) for v in value)
    if len(args) != len(value):
        raise TypedError(f"{key}: expects {len(args)} values, got {len(value)}")
    return tuple(_value(v, a, key) for v, a in zip(value, args))


def _scalar(value: Any, tp: Any, key: str) -> Any:
    if typing.get_origin(tp) is Literal:
        if value not in typing.get_args(tp) or isinstance(value, bool) != any(isinstance(a, bool)
                                                                               for a in typing.get_args(tp)):
            raise TypedError(f"{key}: {value!r} is not one of {typing.get_args(tp)}")
        return value
    ok = {type(None): value is None,
          bool: isinstance(value, bool),
          int: isinstance(value, int) and not isinstance(value, bool),
          float: isinstance(value, (int, float)) and not isinstance(value, bool),
          str: isinstance(value, (str, int, float)) and not isinstance(value, bool)}
    if tp not in ok:
        raise TypedError(f"{key}: unsupported field type {tp}")
    if tp is float and isinstance(value, str):       # PyYAML reads "3e-4" (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if not ok[tp]:
        raise TypedError(f"{key}: expects {_describe(tp)}, got {value!r}")
    return tp(value) if tp in (float, str) else value


def _describe(tp: Any) -> str:
    names = {type(None): "null", bool: "true/false", int: "an integer", float: "a number", str: "a string"}
    if tp in names:
        return names[tp]
    origin = typing.get_origin(tp)
    if origin is Literal:
        return f"one of {typing.get_args(tp)}"
    if origin is tuple:
        return "a list"
    if origin is Annotated:
        return _describe(typing.get_args(tp)[0])
    return "a mapping" if origin is dict or dataclasses.is_dataclass(tp) else str(tp)
