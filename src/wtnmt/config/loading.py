"""Loading run configs: YAML files and presets, ``--set`` overrides, plain dicts.

Every key is checked against the section dataclasses' fields and their types on load (unknown
keys are errors), then each section validates its values.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from wtnmt.config.sections import ConfigError, RunConfig

# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(tp))
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of ({_describe(args[0])})"
        return f"a list of {len(args)} values"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the annotation ``tp``; return it in the field's own type."""
    origin = get_origin(tp)
    if origin is Literal:
        if value in get_args(tp):
            return value
    elif origin in (Union, types.UnionType):
        for arg in get_args(tp):
            try:
                return _coerce(key, value, arg)
            except ConfigError:
                continue
    elif origin is tuple:
        args = get_args(tp)
        if isinstance(value, (list, tuple)):
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(_coerce(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value))
            if len(value) == len(args):
                return tuple(
                    _coerce(f"{key}[{i}]", v, a)
                    for i, (v, a) in enumerate(zip(value, args, strict=True))
                )
    elif tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif dataclasses.is_dataclass(tp):
        if isinstance(value, dict):
            return _build(tp, value, key)
    else:  # pragma: no cover - an annotation this loader does not know is a programming error
        raise TypeError(f"unsupported config annotation {tp!r} for {key}")
    raise ConfigError(f"{key}={value!r} is not allowed: expected {_describe(tp)}")


def _build(cls: type, values: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names, key=str)
    if unknown:
        where = f"{prefix}." if prefix else ""
        key = unknown[0] if str(unknown[0]).isidentifier() else repr(unknown[0])
        close = difflib.get_close_matches(str(unknown[0]), sorted(names), n=1)
        hint = f" (did you mean {where}{close[0]}?)" if close else ""
        raise ConfigError(
            f"unknown config key {where}{key}{hint}: allowed keys in "
            f"{prefix or 'the top level'} are {', '.join(sorted(names))}"
        )
    kwargs = {
        name: _coerce(f"{prefix}.{name}" if prefix else name, value, hints[name])
        for name, value in values.items()
    }
    return cls(**kwargs)


def config_from_dict(values: dict[str, Any]) -> RunConfig:
    """Build a validated :class:`RunConfig` from nested plain values (as YAML gives them)."""
    if not isinstance(values, dict):
        raise ConfigError(f"a config must be a mapping of sections, got {type(values).__name__}")
    return _build(RunConfig, values, "")


def config_to_dict(config: Any) -> dict[str, Any]:
    """Plain nested values (tuples as lists), ready for YAML or JSON."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        return value

    return plain(config)


class _Loader(yaml.SafeLoader):
    """YAML as people write configs: PyYAML follows YAML 1.1, where a float needs a dot, so
    ``adam_eps: 1e-9`` would be read as the string '1e-9'. This also reads ``1e-9`` and
    ``2E0`` as floats, as YAML 1.2 does. A key given twice in one mapping is an error (YAML
    forbids it; PyYAML would keep the last value silently)."""

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue
                key, line = key_node.value, key_node.start_mark.line + 1
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {key!r} given twice (lines {seen[key]} and {line})",
                        key_node.start_mark,
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def yaml_reason(e: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong, and where (PyYAML's message takes several,
    with a drawing of the place)."""
    problem = str(getattr(e, "problem", None) or e).splitlines()[0]
    mark = getattr(e, "problem_mark", None)
    return problem + (f" at line {mark.line + 1}, column {mark.column + 1}" if mark else "")


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: no Python objects


def parse_override(text: str) -> tuple[list[str], Any]:
    """``section.key=value`` → (["section", "key"], value parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    key, raw = text.split("=", 1)
    path = key.strip().split(".")
    if len(path) < 2 or not all(path):
        raise ConfigError(f"--set {text!r}: the key must name a section, e.g. model.d_model=256")
    try:
        return path, _yaml(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(
            f"--set {text!r}: the value is not valid YAML ({yaml_reason(e)})"
        ) from None


def resolve_preset(name_or_path: str | Path) -> Path:
    """A config file path, or the name of a preset shipped in ``wtnmt/configs``."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    preset = PRESET_DIR / f"{name_or_path}.yaml"
    if preset.is_file():
        return preset
    names = ", ".join(sorted(p.stem for p in PRESET_DIR.glob("*.yaml")))
    raise ConfigError(
        f"no config file {str(name_or_path)!r} and no preset of that name: presets are {names}"
    )


def read_yaml_file(path: Path) -> Any:
    """A YAML file's values; a ConfigError naming the file where it cannot be read, is not
    UTF-8, is not valid YAML or gives a key twice."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (at byte offset {e.start})") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror})") from None
    try:
        return _yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({yaml_reason(e)})") from None


# a named corpus's own filters, which a preset sets for its corpus (its sentence lengths, its
# sample): not applied to one's own files unless the user's file or --set states them
CORPUS_FILTERS = ("max_words", "train_size")


def own_files_filters(data: dict[str, Any], stated: set[str]) -> dict[str, Any]:
    """The data keys to reset where one's own files replace a preset's corpus:
    ``CORPUS_FILTERS`` back to their defaults (None) unless ``stated`` (the dotted keys the
    user gave) names them."""
    return {k: None for k in CORPUS_FILTERS if f"data.{k}" not in stated and data.get(k)}


def _merged(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top``'s values over ``base``'s, section by section (a mapping merged key by key)."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def _keys(values: dict[str, Any]) -> set[str]:
    """The dotted ``section.key`` names a config's values state."""
    return {
        f"{section}.{key}"
        for section, keys in values.items()
        if isinstance(keys, dict)
        for key in keys
    }


def _with_bases(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict[str, Any], bool]:
    """The values of the config file ``path`` over those of its ``base:`` (a preset name or
    a config file, itself resolved so), and whether it had one."""
    values = read_yaml_file(path) or {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: a config must be a mapping of sections")
    if "base" not in values:
        return values, False
    base = values.pop("base")
    if not isinstance(base, str) or not base:
        raise ConfigError(
            f"{path}: base={base!r}: give a preset name (`wtnmt presets`) or a config file"
        )
    beside = path.parent / base  # a file named relative to the config that names it
    try:
        base_path = beside if beside.is_file() else resolve_preset(base)
    except ConfigError as e:
        raise ConfigError(f"{path}: base {base!r}: {e}") from None
    chain = (*seen, path.resolve())
    if base_path.resolve() in chain:
        names = " → ".join(str(p) for p in (*chain, base_path.resolve()))
        raise ConfigError(f"{path}: base: the configs name each other in a circle ({names})")
    try:
        inherited, _ = _with_bases(base_path, chain)
    except ConfigError as e:
        raise ConfigError(f"{path}: base {base!r}: {e}") from None
    return _merged(inherited, values), True


def load_config(source: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Load a YAML config (a path or a preset name) and apply ``--set`` overrides.

    A file may start from a preset or another file (``base: weighted-m30k``) and state only
    what differs. Where one's own files (data.train_src, data.train_tsv) replace the corpus of
    a preset (named as the config, or as a base), the preset's corpus filters
    (``CORPUS_FILTERS``) are not applied to them unless stated."""
    path = resolve_preset(source)
    values, has_base = _with_bases(path)
    preset = path.resolve().parent == PRESET_DIR.resolve()
    given = {t.split("=", 1)[0].strip() for t in overrides}
    stated = given | (set() if preset else _keys(read_yaml_file(path) or {}))
    data = values.get("data") or {}
    own = {"data.train_src", "data.train_tsv"}
    if isinstance(data, dict):
        if "data.corpus" not in stated and (
            data.get("train_src") or data.get("train_tsv") or given & own
        ):  # one's own files: not the default (or a base's) corpus beside them
            values["data"] = data = {**data, "corpus": None}
        if (preset or has_base) and stated & own:  # nor that corpus's filters
            values["data"] = data = {**data, **own_files_filters(data, stated)}
    for text in overrides:
        keys, value = parse_override(text)
        node = values
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text!r}: {k} is not a section")
        node[keys[-1]] = value
    try:
        return config_from_dict(values)
    except ConfigError as e:
        # a value an override set is the override's fault, not the file's
        given = [
            t
            for t in overrides
            if str(e).startswith(t.split("=", 1)[0].strip() + "=")
            or str(e).startswith(f"unknown config key {t.split('=', 1)[0].strip()}")
        ]
        where = f"--set {given[-1]!r}" if given else str(path)
        raise ConfigError(f"{where}: {e}") from None
