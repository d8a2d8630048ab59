"""The plugin manager: registration, duplicates, broken plugins, SPDFLOW_LOAD_PLUGINS."""
from __future__ import annotations

import importlib.metadata
import json

import pytest

from spdflow import hookimpl
from spdflow.api import KPolicy
from spdflow.errors import PluginError
from spdflow.plugins import get_plugin_manager
from tests.conftest import MINIMAL, REPO


class AlwaysTwo(KPolicy):
    name = "always_two"

    def choose_k(self, proposal_counts, compiled_ks):
        return 2


class FakePlugin:
    __name__ = "FakePlugin"

    @hookimpl
    def spdflow_register_k_policies(self, register):
        register("always_two", AlwaysTwo, description="test policy")


def test_in_process_plugin_registers_a_name():
    pm = get_plugin_manager()
    pm.add_plugin(FakePlugin(), "fake")
    registration = pm.lookup("k_policy", "always_two")
    assert registration.plugin == "fake"
    assert registration.factory().choose_k([0], [0, 2]) == 2


def test_duplicate_name_names_both_plugins():
    class Dupe:
        @hookimpl
        def spdflow_register_k_policies(self, register):
            register("fixed", AlwaysTwo)

    pm = get_plugin_manager()
    pm.add_plugin(Dupe(), "dupe")
    assert "goodput" in pm.registry()["k_policy"]  # other names still work
    with pytest.raises(PluginError) as info:
        pm.lookup("k_policy", "fixed")
    assert "'decoding'" in info.value.message and "'dupe'" in info.value.message
    assert "registered twice" in {i.name: i for i in pm.describe()}["dupe"].error


def test_unknown_name_suggests_the_closest():
    with pytest.raises(PluginError) as info:
        get_plugin_manager().lookup("proposer", "prompt_lokup")
    assert "did you mean 'prompt_lookup'" in info.value.message


def test_misspelled_hook_fails_check_pending():
    class Typo:
        @hookimpl
        def spdflow_register_proposer(self, register):  # missing the s
            pass

    pm = get_plugin_manager()
    pm.register(Typo(), name="typo")
    import pluggy

    with pytest.raises(pluggy.PluginValidationError):
        pm.check_pending()


def _with_broken_entry_point(monkeypatch):
    real = importlib.metadata.entry_points
    broken = importlib.metadata.EntryPoint(name="broken", value="spdflow_no_such_module_xyz", group="spdflow")

    def fake(**kwargs):
        found = list(real(**kwargs))
        return found + [broken] if kwargs.get("group") == "spdflow" else found

    monkeypatch.setattr("spdflow.plugins.importlib.metadata.entry_points", fake)


def test_broken_plugin_is_listed_with_its_error_and_others_still_load(monkeypatch):
    _with_broken_entry_point(monkeypatch)
    pm = get_plugin_manager()
    infos = {i.name: i for i in pm.describe()}
    assert "ModuleNotFoundError" in infos["broken"].error
    assert infos["proposers"].error is None
    assert "prompt_lookup" in pm.registry()["proposer"]


def test_load_plugins_env_restricts_loading(monkeypatch):
    monkeypatch.setenv("SPDFLOW_LOAD_PLUGINS", "decoding")
    pm = get_plugin_manager()
    names = {i.name for i in pm.describe()}
    assert names == {"builtin", "decoding"}
    monkeypatch.setenv("SPDFLOW_LOAD_PLUGINS", "")
    assert {i.name for i in get_plugin_manager().describe()} == {"builtin"}


def test_no_plugin_manager_exists_at_import():
    import spdflow.plugins as module

    assert not any(isinstance(v, module.SpdflowPluginManager) for v in vars(module).values())


def _with_entry_points(monkeypatch, tmp_path, modules: dict[str, str]):
    """Installed-looking plugins: each module written to ``tmp_path`` with an entry point of its name."""
    for name, text in modules.items():
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    real = importlib.metadata.entry_points
    extra = [importlib.metadata.EntryPoint(name=name, value=name, group="spdflow") for name in modules]

    def fake(**kwargs):
        found = list(real(**kwargs))
        return found + extra if kwargs.get("group") == "spdflow" else found

    monkeypatch.setattr("spdflow.plugins.importlib.metadata.entry_points", fake)


TYPO = """
from spdflow import hookimpl

@hookimpl
def spdflow_register_proposer(register):
    register("typo_proposer", lambda config, ctx: None)
"""

FAILS_REGISTERING = """
from spdflow import hookimpl

@hookimpl
def spdflow_register_k_policies(register):
    register("half_registered", object)
    raise RuntimeError("registration broke")
"""


def test_a_plugin_that_exits_at_import_is_listed_broken_and_spdflow_goes_on(monkeypatch, tmp_path):
    _with_entry_points(monkeypatch, tmp_path, {"exits_at_import": "import sys\nsys.exit(0)\n"})
    pm = get_plugin_manager()
    infos = {i.name: i for i in pm.describe()}
    assert infos["exits_at_import"].error == "SystemExit: 0"
    assert "prompt_lookup" in pm.registry()["proposer"]


def test_a_plugin_with_a_misspelled_hook_is_unregistered_and_only_its_recipes_fail(monkeypatch, tmp_path, write_recipe):
    from spdflow.recipe.loader import load_recipe

    _with_entry_points(monkeypatch, tmp_path, {"typo_plugin": TYPO})
    pm = get_plugin_manager()  # no PluginError for everyone
    info = {i.name: i for i in pm.describe()}["typo_plugin"]
    assert "unknown hook 'spdflow_register_proposer' (did you mean 'spdflow_register_proposers'?)" in info.error
    assert pm.get_plugin("typo_plugin") is None
    load_recipe(write_recipe(), pm)  # a recipe that does not use it loads
    with pytest.raises(PluginError) as caught:
        load_recipe(write_recipe(MINIMAL.replace("uses: prompt_lookup", "uses: typo_proposer")), pm)
    assert caught.value.exit_code == 4 and "typo_plugin" in caught.value.message


def test_a_plugin_that_breaks_while_registering_loses_all_its_names_and_shows_why(monkeypatch, tmp_path):
    _with_entry_points(monkeypatch, tmp_path, {"fails_registering": FAILS_REGISTERING})
    pm = get_plugin_manager()
    registry = pm.registry()
    assert "half_registered" not in registry["k_policy"] and "goodput" in registry["k_policy"]
    info = {i.name: i for i in pm.describe()}["fails_registering"]
    assert "failed in spdflow_register_k_policies: RuntimeError: registration broke" in info.error
    with pytest.raises(PluginError):
        pm.lookup("k_policy", "half_registered")


def test_spdflow_plugins_and_run_survive_a_plugin_that_exits(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from spdflow.cli import cli

    _with_entry_points(monkeypatch, tmp_path, {"exits_at_import": "import sys\nsys.exit(0)\n", "typo_plugin": TYPO})
    result = CliRunner().invoke(cli, ["plugins"])
    assert result.exit_code == 0
    listed = {p["name"]: p for p in json.loads(result.stdout)}
    assert listed["exits_at_import"]["error"] == "SystemExit: 0" and "unknown hook" in listed["typo_plugin"]["error"]
    lint = CliRunner().invoke(cli, ["lint", str(REPO / "recipes" / "tinycode_varK.yaml")])
    assert lint.exit_code == 0, lint.output
