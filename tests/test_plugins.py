"""The plugin manager: registration, duplicates, broken plugins, SPDFLOW_LOAD_PLUGINS."""
from __future__ import annotations

import importlib.metadata

import pytest

from spdflow import hookimpl
from spdflow.api import KPolicy
from spdflow.errors import PluginError
from spdflow.plugins import get_plugin_manager


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
    with pytest.raises(PluginError) as info:
        pm.registry()
    assert "'decoding'" in info.value.message and "'dupe'" in info.value.message


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
