"""Every documented exit code, and one-sentence errors without tracebacks."""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from spdflow.cli import cli

from conftest import MINIMAL, REPO


@pytest.fixture
def runner():
    return CliRunner()


def test_help_and_version(runner):
    assert runner.invoke(cli, ["--help"]).exit_code == 0
    result = runner.invoke(cli, ["--version"])
    assert result.exit_code == 0 and "spdflow" in result.output


def test_lint_exit_0_clean(runner, write_recipe):
    assert runner.invoke(cli, ["lint", str(write_recipe())]).exit_code == 0


def test_lint_exit_1_on_findings_with_strict(runner, write_recipe):
    path = write_recipe(MINIMAL.replace("[0, 4]", "[4, 0]"))
    assert runner.invoke(cli, ["lint", str(path)]).exit_code == 0
    assert runner.invoke(cli, ["lint", "--strict", str(path)]).exit_code == 1


def test_lint_exit_3_on_invalid_recipe_with_location(runner, write_recipe):
    path = write_recipe(MINIMAL.replace("max_new_tokens", "max_new_token"))
    result = runner.invoke(cli, ["lint", str(path)])
    assert result.exit_code == 3
    assert f"{path}:10:3: SPD010 unknown key 'max_new_token'" in result.output
    assert "did you mean 'max_new_tokens'" in result.output


def test_usage_error_exits_2(runner):
    assert runner.invoke(cli, ["lint"]).exit_code == 2
    assert runner.invoke(cli, ["run", "--no-such-flag", "x.yaml"]).exit_code == 2


def test_bad_override_exits_2_with_one_sentence(runner, write_recipe):
    result = runner.invoke(cli, ["run", str(write_recipe()), "--set", "num_speculative_tokens"])
    assert result.exit_code == 2
    assert "is not of the form dotted.key=value" in result.stderr
    assert "Traceback" not in result.output


def test_run_invalid_recipe_exits_3(runner, write_recipe):
    result = runner.invoke(cli, ["run", str(write_recipe(MINIMAL.replace("version: 1", "version: 7")))])
    assert result.exit_code == 3
    assert "is invalid: 1 error" in result.stderr and "Traceback" not in result.output


def test_run_unknown_proposer_via_override_exits_3_naming_the_override(runner, write_recipe):
    result = runner.invoke(cli, ["run", str(write_recipe()), "--set", "proposer.uses=sufix"])
    assert result.exit_code == 3
    assert "--set proposer.uses=sufix: SPD020 unknown proposer 'sufix'; did you mean 'suffix'?" in result.stderr


def test_broken_plugin_breaks_only_recipes_that_use_it(runner, write_recipe, monkeypatch):
    from spdflow import hookimpl

    class Broken:
        @hookimpl
        def spdflow_register_proposers(self, register):
            raise RuntimeError("boom")

    from spdflow import plugins

    real = plugins.get_plugin_manager

    def with_broken(**kwargs):
        pm = real(**kwargs)
        pm.add_plugin(Broken(), "broken-proposer")
        return pm

    monkeypatch.setattr(plugins, "get_plugin_manager", with_broken)
    result = runner.invoke(cli, ["run", str(write_recipe()), "--set", "proposer.uses=brokens_proposer"])
    assert result.exit_code == 4
    assert "plugin 'broken-proposer' failed in spdflow_register_proposers: RuntimeError: boom" in result.stderr
    assert runner.invoke(cli, ["run", "--dry-run", str(write_recipe())]).exit_code == 0  # does not use it


def _cached_snapshot(hf_home, model_id: str) -> None:
    """A local HF cache entry for ``model_id`` holding only config.json (enough for preflight)."""
    repo = hf_home / "hub" / ("models--" + model_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")


def test_llama8b_dry_run_prints_plan(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    _cached_snapshot(tmp_path / "hf", "meta-llama/Llama-3.1-8B-Instruct")
    result = runner.invoke(cli, ["run", str(REPO / "recipes" / "llama8b_varK.yaml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "decode   batch_size=4 seq_len=5 ctx_len=4096 num_logits_to_keep=5 full_batch_size=4" in result.stdout
    assert "note: backend 'qaic' cannot run here" in result.stdout


def test_llama8b_dry_run_without_the_weights_prints_the_plan_and_says_what_run_would_miss(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    result = runner.invoke(cli, ["run", str(REPO / "recipes" / "llama8b_varK.yaml"), "--dry-run"])
    assert result.exit_code == 1
    assert "specializations (3):" in result.stdout
    assert "SPD111 model 'meta-llama/Llama-3.1-8B-Instruct' is not in the local Hugging Face cache" in result.stderr


def test_llama8b_run_stops_at_once_saying_what_is_missing(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    result = runner.invoke(cli, ["run", str(REPO / "recipes" / "llama8b_varK.yaml")])
    assert result.exit_code == 1
    assert "'meta-llama/Llama-3.1-8B-Instruct' is not in the local Hugging Face cache" in result.stderr
    assert "backend 'qaic' cannot run here" in result.stderr
    assert not (tmp_path / "runs").exists()
    assert "Traceback" not in result.output


def test_plugins_json_lists_builtins(runner):
    result = runner.invoke(cli, ["plugins"])
    data = {p["name"]: p for p in json.loads(result.stdout)}
    assert "prompt_lookup" in data["proposers"]["registered"]["proposer"]
    assert "spdflow_export" in data["onnx"]["hooks"]


def test_schema_includes_plugin_configs(runner):
    schema = json.loads(runner.invoke(cli, ["schema"]).stdout)
    assert "proposer_prompt_lookup_config" in schema["$defs"]
    assert "prompt_lookup_max" in schema["$defs"]["proposer_prompt_lookup_config"]["properties"]


def test_committed_schema_file_is_current(runner):
    """recipes/*.yaml point editors at docs/recipe.schema.json: it must match `spdflow schema`."""
    committed = json.loads((REPO / "docs" / "recipe.schema.json").read_text())
    assert committed == json.loads(runner.invoke(cli, ["schema"]).stdout), "run: spdflow schema -o docs/recipe.schema.json"


def test_default_recipe_report_says_what_ran_and_the_measured_speed_up(runner, tmp_path, monkeypatch):
    """The README's quick-start run (shortened by --set): report and summary name the model,
    proposer, K-list and policy and state the speed-up over no-spec measured in the process."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(cli, ["run", str(REPO / "recipes" / "tinycode_varK.yaml"), "--check-lossless",
                                 "--set", "workload.count=2", "--set", "workload.max_new_tokens=24"])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "runs" / "tinycode-varK" / "report.md").read_text()
    for line in ("| model | spdflow:tinycode-target (float32) |", "| proposer | prompt_lookup (", "| K-list | [0, 2, 4, 7] |",
                 "| K policy | goodput;", "| --set | workload.count=2 workload.max_new_tokens=24 |",
                 "| Speed-up: decode tokens/s vs no-spec | ", "Measured against no-spec: decode ran at"):
        assert line in text, line
    report = json.loads((tmp_path / "runs" / "tinycode-varK" / "report.json").read_text())
    assert report["baseline"]["decode_tokens_per_s"] > 0 and report["overrides"] == ["workload.count=2", "workload.max_new_tokens=24"]
    # the summary is a result: stdout; progress stays on stderr
    assert "speed-up vs no-spec" in result.stdout and "spdflow:tinycode-target" in result.stdout
    assert "speed-up vs no-spec" not in result.stderr and "generate: ran" in result.stderr
    # progress on every long stage, as plain lines when stderr is not a terminal, none blank
    for step in ("loading ", "tracing ", "writing weights", "specialization 1/", "generate: ", "tokens budgeted"):
        assert step in result.stderr, step
    assert "" not in result.stderr.rstrip("\n").split("\n")


def test_report_records_its_own_stage_and_cache_reasons_read_once(runner, tmp_path, monkeypatch):
    """report.json lists the report stage as ran (not not_run), and a cached stage's line says
    'cached (key …)' once, not 'cached (cached (key …))'."""
    monkeypatch.chdir(tmp_path)
    args = ["run", str(REPO / "recipes" / "tinycode_nospec.yaml"), "--set", "workload.count=1",
            "--set", "workload.max_new_tokens=4"]
    assert runner.invoke(cli, args).exit_code == 0
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    run_dir = next((tmp_path / "runs").iterdir())
    stages = json.loads((run_dir / "report.json").read_text())["stages"]
    stages = {s["name"]: s for s in stages} if isinstance(stages, list) else stages
    assert stages["report"]["status"] == "ran", stages["report"]
    assert "export: cached (key " in result.stderr and "compile: cached (key " in result.stderr, result.stderr
    assert "cached (cached" not in result.stderr and "| not_run" not in (run_dir / "report.md").read_text()


def test_effective_recipe_hash_changes_under_set(runner, tmp_path, monkeypatch):
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe
    from spdflow.report.build import effective_recipe_sha256

    pm = get_plugin_manager()
    path = REPO / "recipes" / "tinycode_varK.yaml"
    plain = effective_recipe_sha256(load_recipe(path, pm).recipe)
    assert plain == effective_recipe_sha256(load_recipe(path, pm).recipe)
    assert plain != effective_recipe_sha256(load_recipe(path, pm, ["workload.count=3"]).recipe)


# ------------------------------------------------------------------------------- names and words people bring


def test_verbose_is_accepted_anywhere_on_the_command_line(runner, write_recipe, monkeypatch):
    from spdflow.cli import hoist_verbose

    monkeypatch.setenv("SPDFLOW_DEBUG", "0")  # only --verbose asks for the traceback

    assert hoist_verbose(["run", "r.yaml", "-v"]) == ["-v", "run", "r.yaml"]
    assert hoist_verbose(["lint", "--set", "-v", "x", "--", "-v"]) == ["lint", "--set", "-v", "x", "--", "-v"]
    path = write_recipe(MINIMAL.replace("spdflow:tinycode-target", "./nowhere"))
    result = runner.invoke(cli, ["run", str(path), "--verbose"])
    assert result.exit_code == 1 and "Traceback" in result.stderr
    assert os.environ["SPDFLOW_DEBUG"] == "0"  # the flag lives in click's context, not the environment
    result = runner.invoke(cli, ["run", str(path)])
    assert result.exit_code == 1 and "Traceback" not in result.stderr


def test_set_errors_name_the_override_not_a_made_up_line(runner, write_recipe):
    result = runner.invoke(cli, ["lint", str(write_recipe()), "--set", "modle.id=x"])
    assert result.exit_code == 3
    assert result.stdout.startswith("--set modle.id=x: SPD010 unknown key 'modle' in the recipe; did you mean 'model'?")
    result = runner.invoke(cli, ["lint", str(write_recipe()), "--set", "num_speculative_tokens=[0,99]"])
    assert "--set num_speculative_tokens=[0,99]: SPD015 num_speculative_tokens: K must be between 0 and 64" in result.stdout


def test_yaml_tabs_are_explained_in_plain_words(runner, write_recipe):
    result = runner.invoke(cli, ["lint", str(write_recipe("version: 1\nname: t\nmodel:\n\tid: x\n"))])
    assert result.exit_code == 3
    assert ":4:1: SPD001 invalid YAML: a tab character is used for indentation" in result.stdout
    assert "replace the tab with spaces" in result.stdout


def test_ngram_is_vllms_name_for_prompt_lookup(runner, write_recipe, pm):
    assert pm.lookup("proposer", "ngram") is pm.lookup("proposer", "prompt_lookup")
    assert runner.invoke(cli, ["lint", "--strict", str(write_recipe(MINIMAL.replace("prompt_lookup", "ngram")))]).exit_code == 0
    result = runner.invoke(cli, ["lint", str(write_recipe(MINIMAL.replace("prompt_lookup", "ngrams")))])
    assert "unknown proposer 'ngrams'; did you mean 'ngram' (another name for 'prompt_lookup')?" in result.stdout
    assert "prompt_lookup (or ngram)" in result.stdout
    plugins = {p["name"]: p for p in json.loads(runner.invoke(cli, ["plugins"]).stdout)}
    assert plugins["proposers"]["registered"]["proposer"].count("prompt_lookup") == 1


def test_k_policy_names_read_as_english(runner, write_recipe):
    result = runner.invoke(cli, ["lint", str(write_recipe(MINIMAL + "k_policy: goodputt\n"))])
    assert "unknown K policy 'goodputt'; did you mean 'goodput'?" in result.stdout and "installed K policies:" in result.stdout


def test_schema_accepts_an_int_k_list():
    import jsonschema
    import yaml

    schema = json.loads((REPO / "docs" / "recipe.schema.json").read_text())
    recipe = yaml.safe_load(MINIMAL.replace("[0, 4]", "4"))
    jsonschema.validate(recipe, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**recipe, "num_speculative_tokens": [65]}, schema)
