"""The import structure the architecture promises (docs/architecture.md): plugin-facing modules
import no engine module, and spdflow's module-level imports (type-only ones included) form no cycle."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "spdflow"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(target: str, known: set[str]) -> str | None:
    """The spdflow module an import names (``from spdflow.api import X`` -> spdflow.api)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def _imports(tree: ast.Module, name: str, known: set[str]) -> set[str]:
    """Modules imported at module level, including under ``if TYPE_CHECKING:`` (a type edge is an
    edge); imports inside functions are the deliberate lazy ones and are left out."""
    found: set[str] = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.rsplit(".", node.level)[0] if name.count(".") >= node.level else name
                    module = f"{base}.{node.module}" if node.module else base
                else:
                    module = node.module or ""
                targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                continue
            else:
                continue
            for target in targets:
                if target.startswith("spdflow"):
                    module = _resolve(target, known)
                    if module and module != name:
                        found.add(module)

    visit(tree.body)
    return found


def module_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    known = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(ast.parse(p.read_text(encoding="utf-8")), _module_name(p), known)
            for p in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path (first module repeated at the end), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt.startswith("spdflow") and _is_package_init(nxt, node):
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def _is_package_init(target: str, importer: str) -> bool:
    """``import spdflow.x.y`` runs spdflow/__init__ first; a package's own __init__ importing
    a submodule is not a design cycle, so edges to an importer's parent package are skipped."""
    return importer.startswith(target + ".")


def test_the_module_graph_has_no_cycle():
    graph = module_graph()
    assert len(graph) > 30 and "spdflow.api" in graph["spdflow.hookspecs"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"spdflow.a": {"spdflow.b"}, "spdflow.b": {"spdflow.c"}, "spdflow.c": {"spdflow.a"}}) == [
        "spdflow.a", "spdflow.b", "spdflow.c", "spdflow.a"]
    assert find_cycle({"spdflow.a": {"spdflow.b"}, "spdflow.b": set()}) is None


def test_hookspecs_and_api_import_no_engine_module():
    graph = module_graph()
    for module in ("spdflow.hookspecs", "spdflow.api", "spdflow.errors", "spdflow.files"):
        assert not {m for m in graph[module] if m.startswith(("spdflow.engine", "spdflow.report", "spdflow.cli"))}, module


def test_import_spdflow_hookspecs_first_in_a_fresh_interpreter():
    code = ("import sys, spdflow.hookspecs as h; "
            "heavy = sorted(m for m in sys.modules if m.startswith(('spdflow.engine', 'spdflow.plugins', 'torch', 'onnx'))); "
            "assert h.hookspec and not heavy, heavy; print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


# --------------------------------------------------------------------------------------------
# the core names no plugin
#
# Rule: a string literal in spdflow/ (code, not a docstring; comments are not in the AST) that is
# a registered proposer, backend, K policy or acceptor name, or that names one in quotes inside a
# message (``"... 'greedy' ..."``), is the core knowing a plugin by name. The names come from the
# registry at test time (aliases included), so a renamed or new built-in is covered too. The core
# asks a plugin what it needs instead (a policy's required_ks, an acceptor's temperatures, a
# proposer config's peer_equivalent). Docstrings and help prose may mention plugins (unquoted in
# help text). The only literals allowed sit in the module-level definitions below, each with why:
# registration defaults and output field names, not lookups; a new entry needs a reason of that kind.

NAMED_KINDS = ("proposer", "backend", "k_policy", "acceptor")

ALLOWED_DEFINITIONS = {
    ("spdflow/recipe/schema.py", "REFERENCE_POLICY"): "the recipe's default K policy, bench's reference row",
    ("spdflow/recipe/schema.py", "DEFAULT_BACKEND"): "the recipe's default backend, the CPU reference",
    ("spdflow/bench.py", "DEFAULT_MODES"): "the default of bench --modes, policy names the user could type",
    ("spdflow/advise.py", "advice_json"): "the advice JSON's 'nospec' field (an output key, not a lookup)",
    ("spdflow/report/model.py", "ENVIRONMENT_PACKAGES"): "the onnxruntime wheel's version, not the backend",
}


def registered_names() -> dict[str, str]:
    """name -> kind, for every name (and alias) of the kinds the core must not know."""
    from spdflow.plugins import get_plugin_manager

    registry = get_plugin_manager().registry()
    names = {}
    for kind in NAMED_KINDS:
        for name, registration in registry[kind].items():
            for each in (name, *registration.aliases):
                names[each] = kind
    return names


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (module, class, function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def _defined(statement: ast.stmt) -> str:
    """The name a module-level statement defines (a def, class or assigned constant), else ''."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return statement.name
    targets = statement.targets if isinstance(statement, ast.Assign) else \
        [statement.target] if isinstance(statement, ast.AnnAssign) else []
    return next((t.id for t in targets if isinstance(t, ast.Name)), "")


def plugin_names_in_core(names: dict[str, str], root: Path = PACKAGE) -> list[tuple[str, str, int, str, str]]:
    """(path, module-level definition, line, name, the literal) for every plugin name a string
    literal under ``root`` holds."""
    hits = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _docstrings(tree)
        where = path.relative_to(root.parent).as_posix()
        for statement in tree.body:
            for node in ast.walk(statement):
                if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in skip:
                    continue
                for name in names:
                    if node.value == name or f"'{name}'" in node.value:
                        hits.append((where, _defined(statement), node.lineno, name, node.value))
    return hits


def test_the_core_names_no_policy_acceptor_proposer_or_backend():
    names = registered_names()
    # the built-ins are registered, so the scan has names to look for
    assert {"smallest_covering", "nospec", "greedy", "rejection", "prompt_lookup", "onnxruntime", "qaic"} <= set(names)
    found = plugin_names_in_core(names)
    hits = sorted(h for h in found if (h[0], h[1]) not in ALLOWED_DEFINITIONS)
    assert not hits, "plugin names in spdflow/ outside the registration defaults:\n" + "\n".join(
        f"{path}:{line} ({where or 'module'}): {names[name]} '{name}' in {text!r}" for path, where, line, name, text in hits)
    stale = set(ALLOWED_DEFINITIONS) - {(h[0], h[1]) for h in found}
    assert not stale, f"allow-list entries that name no plugin any more: {sorted(stale)}"


def test_the_plugin_name_scan_finds_names_and_skips_docstrings(tmp_path):
    (tmp_path / "a.py").write_text('"""uses \'greedy\' here."""\nX = "nospec"\ndef f():\n    """fixed."""\n'
                                   '    raise ValueError(f"acceptance \'greedy\' at {1}")\nY = "a fixed K"\n')
    hits = [(where, line, name) for _, where, line, name, _ in
            plugin_names_in_core({"greedy": "acceptor", "nospec": "k_policy", "fixed": "k_policy"}, tmp_path)]
    assert sorted(hits) == [("X", 2, "nospec"), ("f", 5, "greedy")]
