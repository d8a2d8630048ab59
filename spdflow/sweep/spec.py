"""The sweep file: a base recipe plus a matrix over recipe keys, expanded into points.

A sweep file is YAML like a recipe::

    version: 1
    name: tinycode-klists
    base: ../tinycode_varK.yaml          # a recipe file (relative to this file) or an inline recipe
    set: {workload.count: 4}             # applied to every point
    matrix:                              # the cross product of these values
      proposer.uses: [prompt_lookup, suffix]
      num_speculative_tokens: [[0, 2], [0, 2, 4, 7]]
    exclude: [{proposer.uses: suffix, num_speculative_tokens: [0, 2]}]
    include: [{proposer: {uses: suffix}, num_speculative_tokens: [0, 4]}]

Keys are the dotted paths of ``--set``. Every expanded point is a full recipe validated (and
linted) exactly like a recipe file before anything runs; its findings point at the line of the
sweep file (or of the base recipe) the value came from.
"""
from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spdflow.files import canonical_json, sha256_text
from spdflow.recipe.loader import (
    LoadedRecipe,
    key_path_problem,
    pydantic_findings,
    set_value,
    validate_document,
)
from spdflow.recipe.schema import Recipe
from spdflow.recipe.yamlsource import Finding, Location, YamlDocument, YamlProblem, parse_yaml

SWEEP_VERSION = 1
#: more points than this is almost certainly a mistake in the matrix
MAX_POINTS = 2000
#: keys the sweep sets on every point itself
OWN_KEYS = ("name", "output")


class SweepSpec(BaseModel):
    """What a sweep file holds (``spdflow sweep``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    version: Literal[1] = Field(description="Sweep file format version; always 1.")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                      description="Sweep name; the output dir is runs/<name> unless output is set.")
    base: Union[str, dict[str, Any]] = Field(
        description="The base recipe: a recipe file path (relative to the sweep file) or an inline recipe mapping. "
        "Relative paths inside it resolve against its own folder (the sweep file's for an inline recipe).")
    set_: dict[str, Any] = Field(default_factory=dict, alias="set",
                                 description="Recipe keys (dotted paths, as --set) given to every point.")
    matrix: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Recipe keys (dotted paths, as --set) and the values to sweep; the points are their cross product.")
    include: list[dict[str, Any]] = Field(
        default_factory=list, description="Extra points, each a mapping of dotted recipe keys to values.")
    exclude: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Drop every matrix point whose values equal all the keys of one entry (matrix keys only).")
    check_lossless: bool = Field(
        True, description="Run each speculative point's no-spec baseline too and record whether its tokens are identical.")
    output: str | None = Field(None, description="Output directory (default runs/<name>): points/, cache/, sweep.json/.md/.html.")
    cache: str | None = Field(
        None, description="Where exports and compiled programs are shared (default <output>/cache); sweeps and "
        "`spdflow run --cache-dir` runs naming the same dir reuse each other's artifacts.")

    def output_dir(self) -> Path:
        return Path(self.output) if self.output else Path("runs") / self.name

    def cache_dir(self) -> Path:
        return Path(self.cache) if self.cache else self.output_dir() / "cache"


@dataclass
class SweepPoint:
    """One expanded recipe of a sweep."""

    id: str  # readable slug + hash; names the point's output dir
    assignments: list[tuple[str, Any]]  # the point's own keys (matrix or include), dotted
    recipe: dict  # the full recipe data
    key: str  # sha256 of what decides the point's result
    loaded: LoadedRecipe | None = None

    def label(self) -> str:
        """``key=value`` pairs of the point's own keys, short."""
        return ", ".join(f"{k}={short_value(v)}" for k, v in self.assignments) or "(base)"


@dataclass
class LoadedSweep:
    """A read sweep file: the spec, its expanded points, and every finding."""

    path: Path
    document: YamlDocument | None
    spec: SweepSpec | None = None
    base_root: Path | None = None
    points: list[SweepPoint] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def output_dir(self) -> Path:
        return self.spec.output_dir() if self.spec else Path("runs")


def is_sweep_document(data: Any) -> bool:
    """A YAML mapping with a ``base`` or ``matrix`` key is a sweep file, not a recipe."""
    return isinstance(data, dict) and ("base" in data or "matrix" in data)


# ------------------------------------------------------------------------------------ values


def short_value(value: Any) -> str:
    """A compact text of a matrix value for labels: lists as [0,2,4], a plugin block by its name."""
    if isinstance(value, dict):
        if "uses" in value:
            return str(value["uses"])
        return "{" + ",".join(f"{k}:{short_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(short_value(v) for v in value) + "]"
    if value is None:
        return "none"
    return str(value)


def _slug(assignments: list[tuple[str, Any]]) -> str:
    text = "_".join(short_value(v) for _, v in assignments)
    text = re.sub(r"[\[\]{}]", "", text)
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")
    return text[:40].rstrip("-._") or "base"


def point_key(recipe: dict, root: Path | None, check_lossless: bool) -> str:
    """What decides a point's result: its recipe (less name and output), where its relative
    paths resolve, and whether the lossless check runs."""
    body = {k: v for k, v in recipe.items() if k not in OWN_KEYS}
    payload = {"recipe": body, "root": str(root) if root else None, "check_lossless": check_lossless}
    return sha256_text(canonical_json(payload))


# ------------------------------------------------------------------------------------ reading


def read_sweep(path: Path | str, pm) -> LoadedSweep:
    """Read, validate and expand a sweep file; every problem becomes a finding (never raises)."""
    path = Path(path)
    loaded = LoadedSweep(path, None)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return _fail(loaded, Location(str(path)), "SPD000", f"no such file '{path}'", "check the path")
    except (OSError, UnicodeDecodeError) as exc:
        return _fail(loaded, Location(str(path)), "SPD000", f"cannot read the sweep file: {exc}", None)
    try:
        document = parse_yaml(text, str(path))
    except YamlProblem as exc:
        loaded.findings.append(exc.finding)
        return loaded
    loaded.document = document
    return validate_sweep(loaded, pm)


def validate_sweep(loaded: LoadedSweep, pm) -> LoadedSweep:
    """Schema of the sweep file, its keys, then every expanded point as a recipe."""
    document = loaded.document
    if not isinstance(document.data, dict):
        return _fail(loaded, document.location(()), "SPD012", "the sweep file must be a YAML mapping",
                     "start from recipes/sweeps/tinycode_klists.yaml")
    try:
        spec = SweepSpec.model_validate(document.data)
    except ValidationError as exc:
        loaded.findings += pydantic_findings(exc, document, (), SweepSpec)
        return loaded
    loaded.spec = spec
    loaded.findings += _check_keys(spec, document)
    base = _base_document(spec, loaded)
    if base is None or loaded.errors:
        return loaded
    combos = _combinations(spec, document, loaded.findings)
    if loaded.errors:
        return loaded
    _expand(loaded, base, combos, pm)
    return loaded


def _fail(loaded: LoadedSweep, location: Location, code: str, message: str, hint: str | None) -> LoadedSweep:
    loaded.findings.append(Finding(location, code, message, hint))
    return loaded


def _keys_of(spec: SweepSpec) -> list[tuple[tuple, str]]:
    """(position in the sweep file, dotted recipe key) of every key the sweep sets."""
    keys = [(("set", k), k) for k in spec.set_] + [(("matrix", k), k) for k in spec.matrix]
    for section, entries in (("include", spec.include), ("exclude", spec.exclude)):
        keys += [((section, i, k), k) for i, entry in enumerate(entries) for k in entry]
    return keys


def _check_keys(spec: SweepSpec, document: YamlDocument) -> list[Finding]:
    """SPD301: every key is a recipe key (did you mean …); SPD305: name/output are the sweep's;
    SPD302: matrix lists are not empty; SPD304: exclude keys are matrix keys."""
    findings = []
    for where, dotted in _keys_of(spec):
        location = document.location(where, key=True)
        keys = tuple(dotted.split("."))
        if any(not part for part in keys):
            findings.append(Finding(location, "SPD301", f"'{dotted}' is not a dotted recipe key",
                                    "write keys as --set does, e.g. proposer.with.prompt_lookup_max"))
            continue
        if keys[0] in OWN_KEYS:
            findings.append(Finding(location, "SPD305", f"the sweep sets '{keys[0]}' of each point itself",
                                    "name the sweep with its own name/output keys"))
            continue
        problem = key_path_problem(Recipe, keys)
        if problem is not None:
            message, close, allowed = problem
            findings.append(Finding(location, "SPD301", message + (f"; did you mean '{close}'?" if close else ""),
                                    f"allowed keys: {', '.join(allowed)}" if allowed else None))
    for dotted, values in spec.matrix.items():
        if not values:
            findings.append(Finding(document.location(("matrix", dotted)), "SPD302",
                                    f"matrix key '{dotted}' has no values", "give a list of at least one value"))
    for i, entry in enumerate(spec.exclude):
        for dotted in entry:
            if dotted not in spec.matrix:
                findings.append(Finding(document.location(("exclude", i, dotted), key=True), "SPD304",
                                        f"exclude key '{dotted}' is not a matrix key, so it can never match",
                                        f"matrix keys: {', '.join(spec.matrix) or '(none)'}"))
    return findings


def _base_document(spec: SweepSpec, loaded: LoadedSweep) -> YamlDocument | None:
    """The base recipe as a positioned document (a file's own positions, or the inline block's)."""
    document = loaded.document
    if isinstance(spec.base, dict):
        loaded.base_root = loaded.path.resolve().parent
        positions = {p[1:]: loc for p, loc in document.positions.items() if p[:1] == ("base",)}
        key_positions = {p[1:]: loc for p, loc in document.key_positions.items() if p[:1] == ("base",)}
        return YamlDocument(spec.base, positions, key_positions, document.source)
    base_path = (loaded.path.parent / spec.base)
    where = document.location(("base",))
    try:
        text = base_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = "no such file" if isinstance(exc, FileNotFoundError) else f"cannot read it ({exc})"
        _fail(loaded, where, "SPD303", f"base recipe '{spec.base}': {reason} (looked at {base_path})",
              "base is a recipe path relative to the sweep file, or an inline recipe mapping")
        return None
    try:
        base = parse_yaml(text, str(base_path))
    except YamlProblem as exc:
        loaded.findings.append(exc.finding)
        return None
    if not isinstance(base.data, dict):
        _fail(loaded, where, "SPD303", f"base recipe '{spec.base}' is not a YAML mapping", None)
        return None
    loaded.base_root = base_path.resolve().parent
    return base


def _combinations(spec: SweepSpec, document: YamlDocument, findings: list[Finding]) -> list[list[tuple[str, Any, tuple]]]:
    """Every point's own assignments as (dotted key, value, position in the sweep file)."""
    keys = list(spec.matrix)
    size = 1
    for values in spec.matrix.values():
        size *= len(values)
    if size + len(spec.include) > MAX_POINTS:
        findings.append(Finding(document.location(("matrix",)), "SPD308",
                                f"the matrix expands to {size + len(spec.include)} points (more than {MAX_POINTS})",
                                "split the sweep, or exclude combinations"))
        return []
    combos, used = [], [False] * len(spec.exclude)
    for indices in itertools.product(*(range(len(spec.matrix[k])) for k in keys)):
        combo = [(k, spec.matrix[k][i], ("matrix", k, i)) for k, i in zip(keys, indices)]
        values = {k: v for k, v, _ in combo}
        hit = [i for i, entry in enumerate(spec.exclude) if all(k in values and values[k] == v for k, v in entry.items())]
        for i in hit:
            used[i] = True
        if not hit:
            combos.append(combo)
    for i, entry in enumerate(spec.exclude):
        if not used[i] and all(k in spec.matrix for k in entry):
            findings.append(Finding(document.location(("exclude", i)), "SPD309", "this exclude entry matches no matrix point",
                                    "compare its values with the matrix (lists must match exactly)", severity="warning"))
    combos += [[(k, v, ("include", i, k)) for k, v in entry.items()] for i, entry in enumerate(spec.include)]
    if not combos:
        findings.append(Finding(document.location(("matrix",)), "SPD307", "the sweep has no points (everything is excluded)",
                                "remove exclude entries or add include entries"))
    return combos


def _expand(loaded: LoadedSweep, base: YamlDocument, combos: list, pm) -> None:
    """Build, validate and lint every point; findings of several points are reported once."""
    from spdflow.lint import RULES
    from spdflow.preflight import preflight

    spec, document = loaded.spec, loaded.document
    out = spec.output_dir().resolve()
    seen: dict[str, SweepPoint] = {}
    grouped: dict[tuple, list[str]] = {}
    for combo in combos:
        point_doc = YamlDocument(copy.deepcopy(base.data), dict(base.positions), dict(base.key_positions), base.source)
        for dotted, value in spec.set_.items():
            set_value(point_doc, tuple(dotted.split(".")), copy.deepcopy(value), document.location(("set", dotted)),
                      document, ("set", dotted))
        for dotted, value, where in combo:
            set_value(point_doc, tuple(dotted.split(".")), copy.deepcopy(value), document.location(where), document, where)
        assignments = [(dotted, value) for dotted, value, _ in combo]
        key = point_key(point_doc.data, loaded.base_root, spec.check_lossless)
        point_id = f"{_slug(assignments)}-{key[:8]}"
        if key in seen:
            loaded.findings.append(Finding(document.location(combo[-1][2] if combo else ("matrix",)), "SPD306",
                                           f"point {point_id} repeats point {seen[key].id} (same recipe); it runs once",
                                           "drop the duplicate include entry or matrix value", severity="warning"))
            continue
        own = document.location(("name",))
        set_value(point_doc, ("name",), point_id, own)
        set_value(point_doc, ("output",), str(out / "points" / point_id), own)
        point = SweepPoint(point_id, assignments, point_doc.data, key)
        point.loaded = validate_document(point_doc, pm, out / "points" / point_id / "recipe.yaml", loaded.base_root)
        findings = list(point.loaded.findings)
        if not point.loaded.errors:  # the checks `spdflow lint` and `spdflow run` make on a recipe
            for rule in RULES:
                findings += rule(point.loaded, pm)
            findings += preflight(point.loaded, pm)
        for finding in findings:
            grouped.setdefault((finding.location, finding.code, finding.message, finding.hint, finding.severity), []).append(point_id)
        seen[key] = point
        loaded.points.append(point)
    for (location, code, message, hint, severity), ids in grouped.items():
        who = f"point {ids[0]}" if len(ids) == 1 else (f"all {len(ids)} points" if len(ids) == len(loaded.points)
                                                        else f"points {', '.join(ids)}")
        loaded.findings.append(Finding(location, code, f"{who}: {message}", hint, severity))


def sweep_json_schema() -> dict:
    """JSON Schema (draft 2020-12) of a sweep file. An inline ``base`` refers to the recipe's
    schema by the relative URL ``recipe.schema.json``: the two files live side by side (docs/)."""
    schema = SweepSpec.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "spdflow sweep"
    base = schema["properties"]["base"]
    schema["properties"]["base"] = {"description": base.get("description", ""),
                                    "anyOf": [{"type": "string"}, {"$ref": "recipe.schema.json"}]}
    return schema
