"""Safe YAML with positions: plain data plus the line and column of every key and value.

Only the YAML 1.2 core types are built (mappings, sequences, strings, numbers, booleans, null;
plain scalars resolved by the 1.2 core schema, so ``yes`` and ``1:30`` are strings);
any other tag is an error, so a recipe can never construct Python objects. Duplicate keys,
merge keys and oversized or too deeply nested documents (alias bombs included) are errors
too. Every problem becomes a ``Finding`` so the caller can report all of them at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

MAX_BYTES = 1_000_000
MAX_NODES = 20_000  # counted after alias expansion: a "billion laughs" stops here
MAX_DEPTH = 40

_SCALAR_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:timestamp",
}


class _CoreLoader(yaml.SafeLoader):
    """SafeLoader with the YAML 1.2 core schema's plain scalars instead of YAML 1.1's: only
    true/false are booleans (``yes``, ``on``, ``y`` are strings), ``1:30`` is a string (not the
    sexagesimal 90), ``010`` is ten, ``0o17`` and ``0x1F`` are ints, ``1e3`` is a float."""


_CoreLoader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in (
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    ("tag:yaml.org,2002:float",
     r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
     list("-+.0123456789")),
):
    _CoreLoader.add_implicit_resolver(_tag, __import__("re").compile(_pattern), _first)


def _core_int(text: str) -> int:
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)


def _core_float(text: str) -> float:
    lowered = text.lower()
    if lowered in (".nan",):
        return float("nan")
    if lowered.lstrip("+-") == ".inf":
        return float("-inf") if text.startswith("-") else float("inf")
    return float(text)


@dataclass(frozen=True)
class Location:
    """Where a value came from: a file position, or a --set override."""

    source: str
    line: int = 1
    col: int = 1

    def render(self) -> str:
        if self.source.startswith("--set "):
            return self.source  # an override has no lines: name it, not a made-up 1:1
        return f"{self.source}:{self.line}:{self.col}"


@dataclass
class Finding:
    """One problem in a recipe; ``severity`` is "error" or "warning"."""

    location: Location
    code: str
    message: str
    hint: str | None = None
    severity: str = "error"

    def render(self) -> str:
        text = f"{self.location.render()}: {self.code} {self.message}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.location.source,
            "line": self.location.line,
            "col": self.location.col,
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "hint": self.hint,
        }


Path_ = tuple  # a key path like ("devices", "device_ids", 2)


class YamlProblem(Exception):
    def __init__(self, finding: Finding):
        super().__init__(finding.message)
        self.finding = finding


class _Builder:
    def __init__(self, source: str):
        self.source = source
        self.positions: dict[Path_, Location] = {}
        self.key_positions: dict[Path_, Location] = {}
        self.nodes = 0
        self.constructor = _CoreLoader("")  # only for its scalar construction

    def loc(self, node: yaml.Node) -> Location:
        return _at(self.source, node.start_mark)

    def fail(self, node: yaml.Node, code: str, message: str, hint: str | None = None):
        raise YamlProblem(Finding(self.loc(node), code, message, hint))

    def build(self, node: yaml.Node, path: Path_, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            self.fail(node, "SPD004", f"the document expands to more than {MAX_NODES} values",
                      "recipes are small; remove the aliases that multiply the document")
        if depth > MAX_DEPTH:
            self.fail(node, "SPD004", TOO_DEEP)
        self.positions.setdefault(path, self.loc(node))
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != "tag:yaml.org,2002:seq":
                self.fail(node, "SPD003", f"unsupported YAML tag '{node.tag}'", "recipes use plain YAML values only")
            return [self.build(child, path + (i,), depth + 1) for i, child in enumerate(node.value)]
        return self._scalar(node)

    def _mapping(self, node: yaml.MappingNode, path: Path_, depth: int) -> dict:
        if node.tag != "tag:yaml.org,2002:map":
            self.fail(node, "SPD003", f"unsupported YAML tag '{node.tag}'", "recipes use plain YAML values only")
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                self.fail(key_node, "SPD003", "YAML merge keys ('<<') are not supported", "write the keys out")
            if not isinstance(key_node, yaml.ScalarNode):
                self.fail(key_node, "SPD003", "a mapping key must be a plain string")
            key = key_node.value
            if key in result:
                first = self.key_positions[path + (key,)]
                self.fail(key_node, "SPD002", f"duplicate key '{key}' (first defined at line {first.line})",
                          "keep one of the two")
            self.key_positions[path + (key,)] = self.loc(key_node)
            self.positions[path + (key,)] = self.loc(value_node)
            result[key] = self.build(value_node, path + (key,), depth + 1)
        return result

    def _scalar(self, node: yaml.ScalarNode) -> Any:
        if node.tag not in _SCALAR_TAGS:
            self.fail(node, "SPD003", f"unsupported YAML tag '{node.tag}'",
                      "recipes cannot construct objects; use plain values")
        if node.tag == "tag:yaml.org,2002:timestamp":
            return node.value  # a date is just text to a recipe
        try:
            if node.tag == "tag:yaml.org,2002:int":
                return _core_int(node.value)
            if node.tag == "tag:yaml.org,2002:float":
                return _core_float(node.value)
            return self.constructor.construct_object(node)
        except (yaml.YAMLError, ValueError, OverflowError) as exc:
            self.fail(node, "SPD001", f"cannot read the value '{node.value[:40]}': {exc}")


@dataclass
class YamlDocument:
    data: Any
    positions: dict[Path_, Location]
    key_positions: dict[Path_, Location]
    source: str

    def location(self, path: Path_, *, key: bool = False) -> Location:
        """The best-known position for ``path``: the key or value itself, else its nearest parent."""
        table = self.key_positions if key else self.positions
        probe = tuple(path)
        while probe:
            if probe in table:
                return table[probe]
            if not key and probe in self.positions:
                return self.positions[probe]
            probe = probe[:-1]
        return self.positions.get((), Location(self.source))


TOO_DEEP = f"the document is nested deeper than {MAX_DEPTH} levels"


def _at(source: str, mark) -> Location:
    """The location of a PyYAML mark (the file alone without one)."""
    return Location(source, mark.line + 1, mark.column + 1) if mark else Location(source)


def _check_depth(text: str, source: str) -> None:
    """Refuse deep nesting from the event stream, before PyYAML's recursive composer sees it
    (thousands of '[' would otherwise take seconds to end in a RecursionError)."""
    depth = 0
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)  # libyaml: no quadratic look-ahead
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise YamlProblem(Finding(_at(source, event.start_mark), "SPD004", TOO_DEEP))
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(exc):
            # libyaml stops at its own limit (1000 levels) before emitting a single event; the
            # pure-Python parse of the same text is quadratic in depth (seconds at 5000 '[')
            mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
            raise YamlProblem(Finding(_at(source, mark), "SPD004", TOO_DEEP))
        return  # syntax errors are reported by the main parse, with its messages
    finally:
        loader.dispose()


def plain_yaml_problem(problem: str, text: str, mark) -> tuple[str, str]:
    """PyYAML's wording of a syntax error in plain words, with a hint that says what to do."""
    line = text.splitlines()[mark.line] if mark is not None and mark.line < len(text.splitlines()) else ""
    if "\\t" in problem or "\t" in line[: (mark.column + 1) if mark else 0]:
        return ("invalid YAML: a tab character is used for indentation",
                "YAML indents with spaces only: replace the tab with spaces")
    if "mapping values are not allowed" in problem:
        return ("invalid YAML: a second ':' on this line (a value cannot hold an unquoted 'key: value')",
                "quote the value (name: \"a: b\") or put the nested key on its own, indented line")
    if "could not find expected ':'" in problem:
        return ("invalid YAML: a line here has no ':' (every line of a mapping is 'key: value')",
                "add the ':' or indent the line under its key")
    if "expected <block end>" in problem or "did not find expected key" in problem:
        return ("invalid YAML: the indentation does not line up with the lines above",
                "indent keys of one mapping by the same number of spaces")
    if "found unexpected end of stream" in problem or "while scanning a quoted scalar" in problem:
        return "invalid YAML: a quote is opened and never closed", "close the quote on the same value"
    if "found undefined alias" in problem:
        return "invalid YAML: '*name' refers to an anchor '&name' that is not defined", "define the anchor or write the value"
    if "expected ',' or ']'" in problem or "expected ',' or '}'" in problem:
        return "invalid YAML: a [list] or {mapping} is not closed, or lacks a ','", "close the bracket and separate items with ','"
    return f"invalid YAML: {problem}", "check indentation (spaces only) and quoting"


def parse_yaml(text: str, source: str) -> YamlDocument:
    """Parse one YAML document into plain data with positions; raises YamlProblem."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise YamlProblem(Finding(Location(source), "SPD004", f"the file is larger than {MAX_BYTES // 1000} kB",
                                  "a recipe is a short YAML file"))
    builder = _Builder(source)
    try:
        _check_depth(text, source)
        loader = _CoreLoader(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        location = _at(source, mark)
        problem = (exc.problem or exc.context or "invalid YAML").strip()
        message, hint = plain_yaml_problem(problem, text, mark)
        raise YamlProblem(Finding(location, "SPD001", message, hint))
    except yaml.YAMLError as exc:
        raise YamlProblem(Finding(Location(source), "SPD001", f"invalid YAML: {exc}"))
    except RecursionError:
        raise YamlProblem(Finding(Location(source), "SPD004", TOO_DEEP))
    if node is None:
        return YamlDocument(None, {(): Location(source)}, {}, source)
    try:
        data = builder.build(node, (), 0)
    except RecursionError:
        raise YamlProblem(Finding(Location(source), "SPD004", TOO_DEEP))
    return YamlDocument(data, builder.positions, builder.key_positions, source)
