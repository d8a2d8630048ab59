"""Recipe text -> validated ``Recipe``, with every error located at path:line:col.

``read_recipe`` never raises for a bad recipe: it returns the findings, so ``lint`` can report
all of them; ``load_recipe`` raises one ``RecipeError`` carrying them all.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from spdflow.errors import PluginError, RecipeError, UsageError
from spdflow.recipe import checks
from spdflow.recipe.schema import DevicesSpec, Recipe
from spdflow.recipe.yamlsource import MAX_BYTES, Finding, Location, YamlDocument, YamlProblem, parse_yaml


@dataclass
class LoadedRecipe:
    """A validated recipe plus where it came from."""

    recipe: Recipe | None
    path: Path
    document: YamlDocument | None
    proposer_config: BaseModel | None = None
    backend_config: BaseModel | None = None
    k_policy_config: BaseModel | None = None
    findings: list[Finding] = field(default_factory=list)
    #: the folder relative paths in the recipe resolve against, when it is not the file's own
    #: (a sweep point's recipe resolves against its base recipe's folder)
    root: Path | None = None
    #: read files outside the recipe's folder (``--allow-outside-paths``; see spdflow.recipe.paths)
    allow_outside_paths: bool = False
    overrides: list[str] = field(default_factory=list)  # the --set expressions applied, in order

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def base_dir(self) -> Path:
        return self.root.resolve() if self.root is not None else self.path.resolve().parent


def parse_override(expr: str) -> tuple[tuple[str, ...], Any]:
    """``dotted.key=value`` -> (("dotted", "key"), value parsed as YAML)."""
    key, sep, raw = expr.partition("=")
    if not sep or not key.strip() or any(not part for part in key.strip().split(".")):
        raise UsageError(f"--set '{expr}' is not of the form dotted.key=value",
                         hint="e.g. --set num_speculative_tokens=[0,2,4]")
    try:
        value = parse_yaml(raw, f"--set {expr}").data
    except YamlProblem as exc:
        raise UsageError(f"--set '{expr}': the value is not valid YAML ({exc.finding.message})") from None
    return tuple(key.strip().split(".")), value


def default_section(keys: tuple[str, ...]) -> dict:
    """The default value of the recipe section at ``keys`` as plain data ({} when it has none)."""
    model: Any = Recipe
    value: Any = None
    for key in keys:
        fields = getattr(model, "model_fields", None)
        if not fields:
            return {}
        field_info = next((f for name, f in fields.items() if (f.alias or name) == key), None)
        if field_info is None:
            return {}
        value = field_info.get_default(call_default_factory=True)
        model = type(value) if isinstance(value, BaseModel) else field_info.annotation
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dict(value) if isinstance(value, dict) else {}


def apply_overrides(document: YamlDocument, overrides: list[str]) -> None:
    """Apply --set overrides in order; their values get the override as their location."""
    if not isinstance(document.data, dict):
        return
    for expr in overrides:
        keys, value = parse_override(expr)
        set_value(document, keys, value, Location(f"--set {expr}"))


def set_value(document: YamlDocument, keys: tuple[str, ...], value: Any, location: Location,
              located: YamlDocument | None = None, located_at: tuple = ()) -> None:
    """Set ``value`` at the dotted path ``keys`` (creating mappings on the way), as --set does.

    Findings about the new value point at ``location``, or, when the value was read from
    another YAML document (a sweep file), at its own positions: ``located`` is that document
    and ``located_at`` the value's path in it.
    """
    node = document.data
    for depth, key in enumerate(keys[:-1]):
        child = node.get(key)
        if not isinstance(child, dict):
            # An absent section starts from its defaults, as if the recipe had left it out:
            # --set workload.max_new_tokens=8 keeps the default prompts.
            child = default_section(keys[: depth + 1]) if key not in node else {}
            node[key] = child
        node = child
    node[keys[-1]] = value
    for path in [p for p in list(document.positions) if p[: len(keys)] == keys]:
        del document.positions[path]
    for i in range(1, len(keys) + 1):
        document.positions.setdefault(keys[:i], location)
        document.key_positions.setdefault(keys[:i], location)  # a key the file does not have: the override
    _mark_all(value, keys, location, document, located, located_at)


def _mark_all(value: Any, path: tuple, location: Location, document: YamlDocument,
              located: YamlDocument | None = None, located_at: tuple = ()) -> None:
    if located is not None:
        location = located.positions.get(located_at, location)
        document.key_positions[path] = located.key_positions.get(located_at, location)
    else:
        document.key_positions[path] = location
    document.positions[path] = location
    if isinstance(value, dict):
        for key, child in value.items():
            _mark_all(child, path + (key,), location, document, located, located_at + (key,))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            _mark_all(child, path + (i,), location, document, located, located_at + (i,))


# ------------------------------------------------------------------------------- validation

_CODES = {
    "extra_forbidden": "SPD010",
    "missing": "SPD011",
    "literal_error": "SPD013",
    "enum": "SPD013",
    "string_pattern_mismatch": "SPD016",
    "value_error": "SPD015",
    "assertion_error": "SPD015",
}
_RANGE_TYPES = ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_short", "too_long")


def pydantic_findings(error: ValidationError, document: YamlDocument, prefix: tuple, model: type[BaseModel],
                      moved: dict[tuple, tuple[str, str]] | None = None) -> list[Finding]:
    """Map pydantic errors to located findings, one per error; ``moved`` explains unknown keys
    that moved elsewhere (path -> message, hint)."""
    findings = []
    for item in error.errors(include_url=False):
        loc = _data_path(document.data, prefix + tuple(item["loc"]))
        kind = item["type"]
        code = _CODES.get(kind, "SPD014" if kind in _RANGE_TYPES else "SPD012")
        where = ".".join(str(p) for p in loc) or "(top level)"
        hint = None
        if kind == "extra_forbidden" and loc in (moved or {}):
            message, hint = moved[loc]
            location = document.location(loc, key=True)
        elif kind == "extra_forbidden":
            key = loc[-1]
            allowed = _fields_at(model, loc[len(prefix):-1])
            message = f"unknown key '{key}' in {'.'.join(map(str, loc[:-1])) or 'the recipe'}"
            close = difflib.get_close_matches(str(key), allowed, n=1)
            if close:
                message += f"; did you mean '{close[0]}'?"
            hint = f"allowed keys: {', '.join(allowed)}" if allowed else None
            location = document.location(loc, key=True)
        elif kind == "missing":
            message = f"missing required key '{where}'"
            hint = "see `spdflow schema` for every key"
            location = document.location(loc[:-1])
        else:
            got = _value_at(document.data, loc)
            message = f"{where}: {_clean(item['msg'])}" + (f" (got {got!r})" if got is not _MISSING and not isinstance(got, (dict, list)) else "")
            location = document.location(loc)
        findings.append(Finding(location, code, message, hint))
    return findings


_MISSING = object()


def _clean(msg: str) -> str:
    msg = msg.replace("Value error, ", "")
    if msg[1:2].isupper() or msg[1:2] in (" ", "="):  # "K must be", "K=0": a name, not a sentence start
        return msg
    return msg[:1].lower() + msg[1:]


def _data_path(data: Any, loc: tuple) -> tuple:
    """Drop pydantic's union-branch tags (e.g. 'list[int]') that are not keys in the data."""
    path: list = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            path.append(part)
            node = node[part]
        elif part == "with" or isinstance(node, dict):
            path.append(part)
            node = None
        # anything else is a union tag; skip it
    return tuple(path)


def _value_at(data: Any, loc: tuple) -> Any:
    node = data
    for part in loc:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return node


def key_path_problem(model: type[BaseModel], keys: tuple[str, ...]) -> tuple[str, str | None, list[str]] | None:
    """Why the dotted path ``keys`` names no key of ``model``, or None: (message, the closest
    allowed key or None, the allowed keys at that level).

    Below a free-form mapping (a plugin's ``with:``) every key is accepted here: the plugin's
    own model checks it when the recipe is validated.
    """
    current: Any = model
    for depth, key in enumerate(keys):
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            if _is_mapping(current):
                return None
            where = ".".join(keys[:depth])
            return f"'{where}' is a value, not a section: it has no key '{key}'", None, []
        info = _field_by_name(current, key)
        if info is None:
            allowed = [i.alias or name for name, i in current.model_fields.items()]
            where = ".".join(keys[:depth]) or "the recipe"
            close = difflib.get_close_matches(key, allowed, n=1)
            return f"unknown key '{key}' in {where}", close[0] if close else None, allowed
        current = _model_in(info.annotation) or info.annotation
    return None


def _is_mapping(annotation: Any) -> bool:
    if getattr(annotation, "__origin__", None) is dict or annotation is dict:
        return True
    return any(_is_mapping(arg) for arg in getattr(annotation, "__args__", ()) or ())


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names (aliases where set) of the model found at ``loc`` under ``model``."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        info = _field_by_name(current, part)
        if info is None:
            return []
        current = _model_in(info.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [info.alias or name for name, info in current.model_fields.items()]
    return []


def _field_by_name(model: type[BaseModel], name: str):
    for field_name, info in model.model_fields.items():
        if name in (field_name, info.alias):
            return info
    return None


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def validate_document(document: YamlDocument, pm, path: Path, root: Path | None = None) -> LoadedRecipe:
    """Schema, plugin names, plugin configs and cross-field checks; collects every finding.

    ``root`` is the folder relative paths resolve against when it is not ``path``'s own."""
    loaded = LoadedRecipe(None, path, document, root=root)
    data = document.data
    if not isinstance(data, dict):
        loaded.findings.append(Finding(document.location(()), "SPD012", "the recipe must be a YAML mapping (key: value lines)",
                                       "start from recipes/tinycode_varK.yaml"))
        return loaded
    loaded.findings.extend(check_names(document, pm))
    if isinstance(data.get("version"), bool):  # Literal[1] would take True (True == 1)
        loaded.findings.append(Finding(document.location(("version",)), "SPD012",
                                       f"version: input should be 1, not the boolean {data['version']}", "write version: 1"))
        return loaded
    try:
        # strict: no bool -> int, str -> int or float -> int coercion (``batch_size: true`` is an error)
        recipe = Recipe.model_validate(data, strict=True)
    except ValidationError as exc:
        loaded.findings.extend(pydantic_findings(exc, document, (), Recipe, moved_keys(data, pm)))
        return loaded
    loaded.recipe = recipe
    for kind, attribute in (("proposer", "proposer_config"), ("backend", "backend_config"), ("k_policy", "k_policy_config")):
        setattr(loaded, attribute, validate_plugin_config(recipe, kind, document, pm, loaded.findings))
    loaded.findings.extend(checks.run_checks(recipe, document))
    loaded.findings.extend(checks.check_lossless_acceptance(recipe, document, pm))
    return loaded


_NAMED = (
    ("proposer", ("proposer", "uses"), "SPD020"),
    ("backend", ("devices", "backend"), "SPD021"),
    ("k_policy", ("k_policy",), "SPD022"),
    ("acceptor", ("acceptance",), "SPD023"),
    ("workload", ("workload", "builtin"), "SPD024"),
)


def check_names(document: YamlDocument, pm) -> list[Finding]:
    """Every name the recipe uses must be registered by an installed plugin.

    Works on the raw data, so unknown names are reported alongside schema errors.
    """
    from spdflow.plugins import aliases_of, unknown_name_hint, unknown_name_message

    findings = []
    registry = pm.registry()
    for kind, path, code in _NAMED:
        if isinstance(_value_at(document.data, path), dict):  # k_policy: {uses: name, with: ...}
            path = path + ("uses",)
        name = _value_at(document.data, path)
        if not isinstance(name, str) or name in registry[kind] or (kind == "acceptor" and name == "auto"):
            continue
        findings.append(Finding(document.location(path), code,
                                unknown_name_message(kind, name, list(registry[kind]), aliases_of(pm, kind)),
                                unknown_name_hint(kind, name, pm)))
    return findings


#: Where each kind of plugin is named in a recipe, and where its ``with:`` block is.
PLUGIN_SECTIONS = {"proposer": ("proposer",), "backend": ("devices",), "k_policy": ("k_policy",)}


def plugin_section(recipe: Recipe, kind: str):
    """The recipe section (``uses``/``backend`` plus ``with_``) that names a plugin of ``kind``."""
    return getattr(recipe, PLUGIN_SECTIONS[kind][0])


def plugin_name(section, kind: str) -> str:
    return section.backend if kind == "backend" else section.uses


def validate_plugin_config(recipe: Recipe, kind: str, document: YamlDocument, pm, findings: list[Finding]) -> BaseModel | None:
    """Validate the ``with:`` block of a proposer, backend or K policy against the plugin's model."""
    section = plugin_section(recipe, kind)
    if section is None:
        return None
    registration = pm.registry()[kind].get(plugin_name(section, kind))
    if registration is None:
        return None
    prefix = PLUGIN_SECTIONS[kind] + ("with",)
    if registration.config is None:
        if section.with_:
            key = next(iter(section.with_))
            findings.append(Finding(document.location(prefix + (key,), key=True), "SPD010",
                                    f"{kind.replace('_', ' ')} '{registration.name}' takes no settings, but {'.'.join(prefix)} has '{key}'",
                                    f"remove {'.'.join(prefix)}"))
        return None
    try:
        return registration.config.model_validate(section.with_, strict=True)
    except ValidationError as exc:
        findings.extend(pydantic_findings(exc, document, prefix, registration.config))
        return None


def moved_keys(data: dict, pm) -> dict[tuple, tuple[str, str]]:
    """Keys of ``devices`` that now belong in a backend's ``with:`` block -> (message, hint)."""
    devices = data.get("devices")
    if not isinstance(devices, dict):
        return {}
    moved = {}
    for key in devices:
        if not isinstance(key, str) or _field_by_name(DevicesSpec, key) is not None:
            continue
        owners = sorted(name for name, registration in pm.registry()["backend"].items()
                        if registration.config is not None and _field_by_name(registration.config, key) is not None)
        if owners:
            moved[("devices", key)] = (f"devices.{key} moved to devices.with.{key}",
                                       f"backend settings live under devices.with (here a setting of {', '.join(owners)})")
    return moved


def read_recipe(path: Path | str, pm, overrides: list[str] | None = None, root: Path | None = None) -> LoadedRecipe:
    """Read, parse and validate a recipe file; bad content becomes findings, never an exception.

    Only a bad ``--set`` expression raises (UsageError): it is a command-line problem.
    """
    path = Path(path)
    source = str(path)
    try:
        text = read_regular_text(path, limit=MAX_BYTES)
    except NotARegularFileError as exc:
        return _unreadable(path, str(exc), "a recipe is a regular .yaml file")
    except FileNotFoundError:
        return _unreadable(path, f"no such file '{path}'", "check the path")
    except IsADirectoryError:
        return _unreadable(path, f"'{path}' is a directory, not a recipe file", None)
    except UnicodeDecodeError as exc:
        return _unreadable(path, f"the file is not UTF-8 text ({exc.reason} at byte {exc.start})", None)
    except OSError as exc:
        return _unreadable(path, f"cannot read the file: {exc.strerror}", None)
    try:
        document = parse_yaml(text, source)
    except YamlProblem as exc:
        return LoadedRecipe(None, path, None, findings=[exc.finding])
    apply_overrides(document, overrides or [])
    loaded = validate_document(document, pm, path, root)
    loaded.overrides = list(overrides or [])
    return loaded


class NotARegularFileError(OSError):
    """The path is a FIFO, a device or a socket: reading it could block forever."""


def read_regular_text(path: Path, limit: int | None = None) -> str:
    """The UTF-8 text of a regular file. A FIFO, device or socket is refused without blocking
    (opened non-blocking, checked with fstat before any read)."""
    import os
    import stat

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(str(path))
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
            raise NotARegularFileError(f"'{path}' is {kind}, not a regular file")
        data = handle.read() if limit is None else handle.read(limit + 1)
    if limit is not None and len(data) > limit:
        return data.decode("utf-8", "replace")  # oversized: the caller reports the size, not the encoding
    return data.decode("utf-8")


def _unreadable(path: Path, message: str, hint: str | None) -> LoadedRecipe:
    return LoadedRecipe(None, path, None, findings=[Finding(Location(str(path)), "SPD000", message, hint)])


def load_recipe(path: Path | str, pm, overrides: list[str] | None = None, root: Path | None = None, *,
                allow_outside_paths: bool = False) -> LoadedRecipe:
    """Like read_recipe, but a recipe with any error raises one RecipeError with all findings.

    ``allow_outside_paths`` lets the recipe read files outside its folder (see spdflow.recipe.paths)."""
    loaded = read_recipe(path, pm, overrides, root)
    loaded.allow_outside_paths = allow_outside_paths
    errors = loaded.errors
    if errors:
        require_plugin_names(loaded, pm)
        count = f"{len(errors)} error{'s' if len(errors) > 1 else ''}"
        raise RecipeError(f"recipe '{path}' is invalid: {count}", findings=errors)
    return loaded


def require_plugin_names(loaded: LoadedRecipe, pm) -> None:
    """Raise PluginError when a name the recipe uses belongs to a plugin that failed to load."""
    broken = [info for info in pm.infos.values() if info.error]
    unknown = [f for f in loaded.findings if f.code in {"SPD020", "SPD021", "SPD022", "SPD023", "SPD024"}]
    if broken and unknown:
        raise PluginError(f"{unknown[0].message.split(';')[0]}, and "
                          + "; ".join(f"plugin '{b.name}' is broken: {b.error}" for b in broken),
                          hint="`spdflow plugins` lists every plugin and its error; fix or reinstall the broken one")
