"""Meta-tests: docs/hooks.md documents every hook with its exact signature and its tested example."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from spdflow.plugins import get_plugin_manager

REPO = Path(__file__).resolve().parents[1]
HOOKS_MD = REPO / "docs" / "hooks.md"
HOOK_TESTS = REPO / "tests" / "test_hooks.py"


def hook_signatures() -> dict[str, list[str]]:
    """Every hook of a plugin manager and its spec's argument names."""
    pm = get_plugin_manager(load_entry_points=False)
    return {name: list(getattr(pm.hook, name).spec.argnames) for name in dir(pm.hook) if name.startswith("spdflow_")}


def doc_headings() -> dict[str, str]:
    """name -> the heading text ``name(arg, ...)`` of every ``### `` heading in hooks.md."""
    found = re.findall(r"^###\s+(spdflow_\w+)\((.*?)\)\s*$", HOOKS_MD.read_text(), flags=re.M)
    return {name: f"{name}({args})" for name, args in found}


def example(hook: str) -> str | None:
    """The example code between the start/end markers for ``hook`` in tests/test_hooks.py."""
    match = re.search(rf"^[ ]*# -- start {hook} --\n(.*?)^[ ]*# -- end {hook} --", HOOK_TESTS.read_text(), re.S | re.M)
    return textwrap.dedent(match.group(1)).strip() if match else None


@pytest.mark.parametrize("hook", sorted(hook_signatures()))
def test_hook_is_documented_with_its_signature(hook):
    expected = f"{hook}({', '.join(hook_signatures()[hook])})"
    headings = doc_headings()
    assert hook in headings, f"docs/hooks.md has no heading '### {expected}'"
    assert headings[hook] == expected, f"docs/hooks.md heading '{headings[hook]}' should be '{expected}'"


@pytest.mark.parametrize("hook", sorted(hook_signatures()))
def test_hook_example_in_docs_is_the_tested_one(hook):
    code = example(hook)
    assert code, f"tests/test_hooks.py has no '# -- start {hook} --' example"
    assert code in HOOKS_MD.read_text(), f"the example of {hook} in docs/hooks.md differs from tests/test_hooks.py"


def test_docs_name_no_hook_that_does_not_exist():
    unknown = set(doc_headings()) - set(hook_signatures())
    assert not unknown, f"docs/hooks.md documents hooks that do not exist: {sorted(unknown)}"


# ------------------------------------------------------------------------------ docs/architecture.md

ARCHITECTURE_MD = REPO / "docs" / "architecture.md"


def architecture_paths() -> list[str]:
    """Every repository path (``spdflow/...``, ``plugins/...``, ``docs/...``, ``tests/...``) named
    in backticks in docs/architecture.md."""
    return re.findall(r"`((?:spdflow|plugins|docs|tests)/[\w./-]*)`", ARCHITECTURE_MD.read_text(encoding="utf-8"))


def architecture_names() -> list[tuple[str, str]]:
    """(module path, name) for every ``Engine.method`` the page names, all in spdflow/engine/run.py."""
    return [("spdflow/engine/run.py", name)
            for name in re.findall(r"`Engine\.(\w+)`", ARCHITECTURE_MD.read_text(encoding="utf-8"))]


def test_architecture_names_only_paths_and_methods_that_exist():
    paths = architecture_paths()
    assert len(paths) > 20
    missing = [p for p in paths if not (REPO / p).exists()]
    assert missing == []
    from spdflow.engine.run import Engine

    names = architecture_names()
    assert names and [n for _, n in names if not hasattr(Engine, n)] == []


def test_architecture_lists_every_top_level_module_of_the_core():
    """The page keeps naming the modules a newcomer reads first (a rename must update it)."""
    text = ARCHITECTURE_MD.read_text(encoding="utf-8")
    for name in ("api.py", "hookspecs.py", "plugins.py", "errors.py", "files.py", "engine/run.py",
                 "engine/generate.py", "report/metrics.py", "report/model.py"):
        assert f"`spdflow/{name}`" in text, name


# ------------------------------------------------------------------------------ README: with: fields


def test_readme_lists_every_builtin_plugins_with_fields_as_the_schema_says():
    from spdflow.recipe.jsonschema import with_fields_markdown

    text = (REPO / "README.md").read_text(encoding="utf-8")
    begin, end = "<!-- BEGIN with-fields -->\n", "<!-- END with-fields -->"
    committed = text[text.index(begin) + len(begin):text.index(end)]
    generated = with_fields_markdown(get_plugin_manager())
    assert committed == generated, "regenerate: spdflow schema --with-fields (between the with-fields markers)"
    for needle in ("`onnxruntime` | `threads`", "`qaic` | `num_cores`", "`goodput` | `margin`",
                   "`prompt_lookup` | `prompt_lookup_max`"):
        assert needle in generated
