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
