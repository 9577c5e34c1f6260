"""Typed experiment configs, declared once: sections, conversion, dotted fields, saved configs.

An experiment's config is a tree of frozen dataclasses (`Section`s) whose field defaults are
the only defaults there are. A config file (`configs/*.py`) starts from them
(`defaults(Schema)`, an ml_collections ConfigDict, which is what `--config.x.y=` overrides
act on and what a workdir's `config.json` records) and sets what its job needs.
`parse(Schema, config)` reads a ConfigDict, or a dict such as a saved `config.json`, into the
typed tree without changing it. Every field is checked against its annotation and its
declared bounds or choices when a section is built (also when one is built in code), then
the section's own cross-field `check`; every error is a `ConfigError` that names the field,
`config.rl.steps: must be an integer >= 1, got 0`. A field the schema does not have (a
misspelling) and one it has but the config lacks are errors too. Nothing here reads a config
file: validation works from an installed package without `configs/`.

Saved configs (a run's `config.json`, a stage's fingerprint) are compared with today's
through one `ConfigHistory` per experiment: the fields added since a config was saved (with
the value that reproduces what it did), the fields renamed since (compared under today's
name), and how fields are compared by what they do. A renamed field's old name set by a
config is an error naming both (`parse(..., renamed=)`).
`check_resumable` and `check_stage` refuse a run or a stage saved under a different config,
naming the fields and, for a field the saved config predates, the flag that continues it as
it was. A run's `config.json` is read by `read_saved_config` first: a file that is not UTF-8
JSON, not an object, or whose fields are not the schema's (a value of the wrong type or out
of its bounds, an unknown field, a field today's config compares that it lacks) is one
`ConfigError` naming the file and the field, never a traceback, and never a resume.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import ml_collections
from ml_collections import config_dict
from ml_collections.config_flags import config_path

from wmrl.config_errors import ConfigError

# ----------------------------------------------------------------------------- dotted fields


def get_field(config, dotted: str):
    """The value of a dotted field (`"rl.steps"`) of a ConfigDict, dict or typed section."""
    return config_path.get_value(dotted, config)


def set_fields(config, items: Mapping[str, Any]):
    """Set dotted fields (`{"rl.steps": 3}`) of a ConfigDict in place (its type checks apply;
    a field it does not have is a KeyError naming the field); returns it."""
    for dotted, value in items.items():
        try:
            config_path.get_value(dotted, config)
        except (KeyError, AttributeError) as e:
            raise KeyError(f"no config field {dotted!r}") from e
        config_path.set_value(dotted, config, value)
    return config


def flatten(tree: Mapping, prefix: str = "") -> dict:
    """{dotted field: leaf value} of a nested mapping (e.g. `plain(config)`)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def plain(config) -> dict:
    """A config as the JSON a workdir's `config.json` holds (tuples become lists): from a
    ConfigDict, a typed section or a dict."""
    if isinstance(config, Section):
        config = as_dict(config)
    elif hasattr(config, "to_json_best_effort"):
        return json.loads(config.to_json_best_effort())
    return json.loads(json.dumps(config))


def load_config_file(path: str | Path, *args) -> ml_collections.ConfigDict:
    """`get_config(*args)` of a config file, loaded by path (config files are not a package)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"wmrl_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(*args)


# ----------------------------------------------------------------------------- sections

_NONE: Mapping = types.MappingProxyType({})  # an empty mapping, as a default


def setting(
    default,
    *,
    low: float | None = None,
    high: float | None = None,
    above: float | None = None,
    below: float | None = None,
    choices: Iterable | None = None,
    finite: bool = True,
    optional: bool = False,
    note: str = "",
):
    """A section field: its default and what a value must satisfy beyond its annotation.

    Numbers: `low <= v <= high`, `above < v < below`, finite unless `finite=False`; strings
    (and the items of a tuple of strings): one of `choices`. Bounds of a tuple of numbers
    apply to each item. `optional`: a config may leave the field out (it is None then, and
    `defaults` leaves it out). `note` is added to the field's errors (why the bound).
    """
    choices = tuple(choices) if choices is not None else None
    meta = dict(low=low, high=high, above=above, below=below, finite=finite, note=note,
                choices=choices, optional=optional)  # fmt: skip
    return dataclasses.field(default=default, metadata={"wmrl": meta})


def subsection(cls):
    """A nested section field, defaulting to the section's own defaults."""
    return dataclasses.field(default_factory=cls)


class Section:
    """Base of the typed config sections (frozen dataclasses, keyword-only, made with
    `@section`). Building one checks every field against its annotation and `setting`, then
    calls `check` (cross-field rules, overridden by sections that have some); a bad value is
    a `ConfigError` naming the field relative to the section (`parse` prefixes the path)."""

    def __post_init__(self):
        hints = _hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            meta = f.metadata.get("wmrl", {})
            if meta.get("optional") and value is None:
                continue
            checked = _check(f.name, value, hints[f.name], meta)
            if checked is not value:
                object.__setattr__(self, f.name, checked)  # a list read as its tuple, once
        self.check()

    def check(self) -> None:
        """Cross-field rules of this section (none by default)."""


def section(cls):
    """Declare a typed config section: `@section class RLConfig(Section): ...`."""
    return dataclasses.dataclass(frozen=True, kw_only=True)(cls)


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _fail(field: str, problem: str, meta: dict):
    note = meta.get("note")
    raise ConfigError(field, f"{problem} ({note})" if note else problem)


def _bound_text(meta: dict) -> str:
    low, high, above, below = (meta.get(k) for k in ("low", "high", "above", "below"))
    if low is not None and high is not None:
        return f" in [{low}, {high}]"
    parts = [f"{op} {v}" for op, v in ((">=", low), ("<=", high), (">", above), ("<", below))
             if v is not None]  # fmt: skip
    return " " + " and ".join(parts) if parts else ""


def _in_bounds(v, meta: dict) -> bool:
    low, high, above, below = (meta.get(k) for k in ("low", "high", "above", "below"))
    return ((low is None or v >= low) and (high is None or v <= high)
            and (above is None or v > above) and (below is None or v < below))  # fmt: skip


def _check(name: str, value, kind, meta: dict):
    """`value` checked as `kind` (a type annotation); returns it (a list as a tuple)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return value
        (kind,) = [a for a in args if a is not type(None)]
        return _check(name, value, kind, meta)
    if isinstance(kind, type) and issubclass(kind, Section):
        if not isinstance(value, kind):
            _fail(name, f"must be a {kind.__name__} section, got {value!r}", meta)
        return value
    if origin is tuple:
        if not isinstance(value, tuple | list):
            _fail(name, f"must be a tuple, got {value!r}", meta)
        items = tuple(_item(name, i, v, args[0], meta) for i, v in enumerate(value))
        same = isinstance(value, tuple) and all(a is b for a, b in zip(items, value, strict=True))
        return value if same else items
    return _scalar(name, value, kind, meta)


def _item(name: str, i: int, value, kind, meta: dict):
    try:
        return _scalar(f"{name}[{i}]", value, kind, meta)
    except ConfigError as e:
        raise ConfigError(name, f"item {i}: {e.problem}") from None


def _scalar(name: str, value, kind, meta: dict):
    if kind is bool:
        if not isinstance(value, bool):
            _fail(name, f"must be True or False, got {value!r}", meta)
    elif kind is int:
        if not isinstance(value, int) or isinstance(value, bool) or not _in_bounds(value, meta):
            _fail(name, f"must be an integer{_bound_text(meta)}, got {value!r}", meta)
    elif kind is float:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        finite = number and (math.isfinite(value) or not meta.get("finite", True))
        if not (finite and _in_bounds(value, meta)):  # NaN fails every bound
            what = "finite number" if meta.get("finite", True) else "number"
            _fail(name, f"must be a {what}{_bound_text(meta)}, got {value!r}", meta)
        return float(value) if type(value) is not float else value
    elif kind is str:
        if not isinstance(value, str):
            _fail(name, f"must be a string, got {value!r}", meta)
    elif kind is dict:
        if not isinstance(value, Mapping):
            _fail(name, f"must be a mapping, got {value!r}", meta)
        return value if isinstance(value, dict) else dict(value)
    else:
        raise TypeError(f"config field {name}: unsupported annotation {kind!r}")
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        _fail(name, f"must be one of {choices}, got {value!r}", meta)
    return value


def parse(
    schema: type[Section], config, *, path: str = "config", renamed: Mapping[str, str] = _NONE
) -> Section:
    """The typed `schema` read from `config` (a ConfigDict or a plain dict), which is left
    as it was. Unknown fields, missing ones and bad values are `ConfigError`s naming the
    field; a field of `renamed` (old dotted name -> new, `ConfigHistory.renamed`) under its
    old name is one naming both."""
    data = config.to_dict() if hasattr(config, "to_dict") else config
    return _parse(schema, data, path, renamed)


def _parse(schema: type[Section], data, path: str, renamed: Mapping[str, str] = _NONE) -> Section:
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"must be a section ({schema.__name__}), got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(schema)}
    hints = _hints(schema)
    unknown = [k for k in data if k not in fields]
    root = path.partition(".")[0]
    for k in unknown:
        old = f"{path}.{k}".removeprefix(root + ".")
        if old in renamed:
            raise renamed_field(old, renamed[old], root)
    if unknown:
        raise ConfigError(
            f"{path}.{unknown[0]}",
            f"unknown field (not in {schema.__name__}); unknown: {', '.join(map(str, unknown))}",
        )
    missing = [n for n, f in fields.items()
               if n not in data and not f.metadata.get("wmrl", {}).get("optional")]  # fmt: skip
    if missing:
        raise ConfigError(
            f"{path}.{missing[0]}",
            f"missing (a config file starts from the schema's defaults, "
            f"wmrl.experiment.config.defaults); missing: {', '.join(missing)}",
        )
    values = {}
    for name, value in data.items():
        kind = hints[name]
        if isinstance(kind, type) and issubclass(kind, Section):
            value = _parse(kind, value, f"{path}.{name}", renamed)
        values[name] = value
    try:
        return schema(**values)
    except ConfigError as e:
        raise ConfigError(f"{path}.{e.field}", e.problem) from None


def renamed_field(old: str, new: str, root: str = "config") -> ConfigError:
    """The error for a config that sets a field under its old name (`ConfigHistory.renamed`):
    `config.rl.old: rl.old was renamed rl.new; set config.rl.new instead`."""
    return ConfigError(f"{root}.{old}", f"{old} was renamed {new}; set {root}.{new} instead")


def as_dict(cfg: Section) -> dict:
    """The section as nested dicts (tuples kept), without the optional fields left unset."""
    out = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value is None and f.metadata.get("wmrl", {}).get("optional"):
            continue
        out[f.name] = as_dict(value) if isinstance(value, Section) else value
    return out


def to_config_dict(cfg: Section) -> ml_collections.ConfigDict:
    """The section as a ConfigDict: what a config file returns and `--config.x.y=` changes.
    A field that may be None (`float | None`) and is holds a typed placeholder, so that
    `--config.x.y=0.3` can set it (ml_collections cannot override a plain None)."""
    return ml_collections.ConfigDict(_with_placeholders(cfg))


def _with_placeholders(cfg: Section) -> dict:
    """`as_dict`, a None of a scalar field as `config_dict.placeholder(its type)`."""
    out, hints = {}, _hints(type(cfg))
    for name, value in as_dict(cfg).items():
        if isinstance(value, dict) and isinstance(getattr(cfg, name), Section):
            value = _with_placeholders(getattr(cfg, name))
        elif value is None:
            kinds = [a for a in typing.get_args(hints[name]) if a is not type(None)]
            if len(kinds) == 1 and kinds[0] in (int, float, str, bool):
                value = config_dict.placeholder(kinds[0])
        out[name] = value
    return out


def defaults(schema: type[Section]) -> ml_collections.ConfigDict:
    """Every field of `schema` at its default: where a config file starts."""
    return to_config_dict(schema())


# ----------------------------------------------------------------------------- saved configs

_ABSENT = "<absent>"


def _same(flat: dict) -> dict:
    return flat


@dataclasses.dataclass(frozen=True)
class ConfigHistory:
    """How configs an experiment saved in the past (a run's config.json, a stage's
    fingerprint) compare with today's.

    added: fields added after configs were saved, each with the value that reproduces what a
        config saved without it did; applied to the fields the compared config has (a stage
        fingerprint holds only its own).
    renamed: fields renamed after configs were saved (old dotted name -> new): a saved
        config's value under the old name compares as the new field's (the old name set by
        a config is refused: `parse(..., renamed=history.renamed)`).
    resolve: maps flat fields to what they do, so that two spellings of the same behaviour
        compare equal (e.g. a fusion switch `auto` in a mode where it means `mean`).
    resumable: fields a resumed run may change (they do not change what a completed step
        computed).
    """

    added: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    renamed: Mapping[str, str] = dataclasses.field(default_factory=dict)
    resolve: Callable[[dict], dict] = _same
    resumable: tuple[str, ...] = ()

    def upgrade(self, saved: Mapping, fields: Iterable[str]) -> dict:
        """A saved config (flat) under today's names (`renamed`), with the added fields
        among `fields` at their legacy values."""
        out = {self.renamed.get(k, k): v for k, v in saved.items()
               if not (k in self.renamed and self.renamed[k] in saved)}  # fmt: skip
        for k in fields:
            if k in self.added:
                out.setdefault(k, self.added[k])
        return out

    def differences(self, saved, current) -> list[str]:
        """Dotted fields whose values differ between `saved` (a saved config or fingerprint)
        and `current` (a ConfigDict, typed section or dict), but those a resume may change."""
        now = flatten(plain(current))
        before = self.upgrade(flatten(plain(saved)), now)
        now, before = self.resolve(now), self.resolve(before)
        differs = lambda k: _norm(now.get(k, _ABSENT)) != _norm(before.get(k, _ABSENT))
        return [k for k in sorted(set(now) | set(before)) if k not in self.resumable and differs(k)]

    def hint(self, saved, diff: Iterable[str]) -> str:
        """For differing fields the saved config holds under an old name (`renamed`), that
        name; for those it predates (`added`), how to continue it as it was: ` (written
        before wm.runtime_coef existed: pass --config.wm.runtime_coef=0.0 to continue it as
        it was)`; '' when there are none."""
        before, diff = set(flatten(plain(saved))), list(diff)
        renamed = [f"{new}, saved under its old name {old}" for old, new in self.renamed.items()
                   if old in before and new in diff]  # fmt: skip
        out = f" ({'; '.join(renamed)})" if renamed else ""
        old = [k for k in diff if k in self.added and k not in before]
        if not old:
            return out
        flags = " ".join(f"--config.{k}={self.added[k]}" for k in old)
        return out + (
            f" (written before {', '.join(old)} existed: pass {flags} to continue it as it was)"
        )


def _norm(v):
    return list(v) if isinstance(v, tuple) else v


_EDITED = "restore the file or choose a new --workdir"


def read_saved_config(
    path, history: ConfigHistory, schema: type[Section], current, ignore: Iterable[str] = ()
) -> dict:
    """A run's saved `config.json` (an epath or local path), checked before anything is
    compared with it: UTF-8 JSON holding an object; every field it holds, under today's name
    (`history.renamed`), a field of `schema` whose value has the field's type and bounds
    (`setting`); every field `current` has that a resume compares (not `history.resumable`,
    not `ignore`) present, or one `history.added` fills. Anything else is a ConfigError
    naming the file and the field. Cross-field rules are not applied: the comparison with
    today's config (which passed them) refuses any difference."""
    name = str(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(name, f"is not UTF-8 text ({e}); {_EDITED}") from None
    try:
        saved = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ConfigError(
            name, f"is not valid JSON (cut short or edited: {e}); {_EDITED}"
        ) from None
    if not isinstance(saved, dict):
        raise ConfigError(
            name, f"must hold a JSON object (a config), got {type(saved).__name__}; {_EDITED}"
        )
    now = flatten(plain(current))
    flat = history.upgrade(flatten(saved), now)
    for dotted, value in flat.items():
        problem = _saved_field_problem(schema, dotted, value)
        if problem is not None:
            raise ConfigError(name, f"config.{problem}; {_EDITED}")
    skip = set(history.resumable) | set(ignore)
    lacking = [k for k in now if k not in flat and k not in skip]
    if lacking:
        listed = ", ".join(lacking[:5]) + (", ..." if len(lacking) > 5 else "")
        raise ConfigError(
            name,
            f"config.{lacking[0]}: missing (the saved config lacks {len(lacking)} field(s) "
            f"this version compares: {listed}); {_EDITED}",
        )
    return saved


def _saved_field_problem(schema: type[Section], dotted: str, value) -> str | None:
    """What is wrong with the flat field `dotted` = `value` of a saved config under
    `schema` ("rl.steps: must be an integer >= 1, got 'many'"), or None."""
    parts = dotted.split(".")
    cls = schema
    for i, part in enumerate(parts):
        here = ".".join(parts[: i + 1])
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if part not in fields:
            return f"{here}: unknown field (not in {cls.__name__})"
        kind, meta = _hints(cls)[part], fields[part].metadata.get("wmrl", {})
        args = typing.get_args(kind)
        if typing.get_origin(kind) in (typing.Union, types.UnionType):
            kind = next(a for a in args if a is not type(None))
        last = i == len(parts) - 1
        if isinstance(kind, type) and issubclass(kind, Section):
            if last:
                return f"{here}: must be a {kind.__name__} section, got {_shown(value)}"
            cls = kind
            continue
        if not last:  # a mapping where a value belongs (but a dict field's entries)
            if kind is dict:
                return None
            return f"{here}: must be a value, got a mapping"
        if value is None and (meta.get("optional") or type(None) in args):
            return None
        try:
            _check(here, value, _hints(cls)[part], meta)
        except ConfigError as e:
            return str(e)
        return None
    return None


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}... ({len(text)} characters)"


def check_resumable(
    history: ConfigHistory,
    config,
    workdir,
    ignore: Iterable[str] = (),
    schema: type[Section] | None = None,
) -> None:
    """A workdir (a local folder or an epath URL) holding a run with a different config is
    refused, naming the fields (but those in `ignore`); with `schema`, its config.json is
    checked first (`read_saved_config`)."""
    from etils import epath

    saved = epath.Path(workdir) / "config.json"
    if not saved.exists():
        return
    if schema is not None:
        before = read_saved_config(saved, history, schema, config, ignore)
    else:
        before = json.loads(saved.read_text())
    ignore = set(ignore)
    diff = [k for k in history.differences(before, config) if k not in ignore]
    if diff:
        raise ConfigError(
            "config",
            f"{workdir} holds a run with a different config (fields: {', '.join(diff)}); "
            "resume it with the same config or choose a new --workdir" + history.hint(before, diff),
        )


def check_stage(history: ConfigHistory, stage_dir, saved: Mapping, want: Mapping) -> None:
    """A stage saved with fingerprint `saved` is refused when today's (`want`) differs,
    naming the fields (loading it would fail on shapes, or silently differ)."""
    diff = history.differences(saved, want)
    if diff:
        raise ConfigError(
            "config.init_dir",
            f"{stage_dir} was made with a different config (fields: {', '.join(diff)}); "
            "use another init_dir or the same settings" + history.hint(saved, diff),
        )
