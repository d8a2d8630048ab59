"""The built-in workloads (plugins/spdflow_workloads): determinism, held-out split, counts."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import spdflow_workloads as workloads
from spdflow.errors import SpdflowError
from spdflow.plugins import SpdflowPluginManager


def test_registers_code_rare_chat_edit_qa_and_the_evaluation_sets():
    pm = SpdflowPluginManager()
    pm.add_plugin(workloads, "workloads")
    registry = pm.registry()["workload"]
    assert set(registry) == {"code", "rare", "chat", "edit", "qa", "stdlib_tests", "thirdparty"}
    assert all(r.description for r in registry.values())
    for name in workloads.EVALUATION_ONLY:
        assert registry[name].description.startswith("Evaluation only"), name


@pytest.mark.parametrize("name", ["code", "rare", "chat", "stdlib_tests", "thirdparty"])
def test_factories_are_deterministic_and_return_count_prompts(name):
    factory = getattr(workloads, f"{name}_workload")
    prompts = factory(20, 3)
    assert len(prompts) == 20 and all(isinstance(p, str) and p.strip() for p in prompts)
    assert factory(20, 3) == prompts
    assert factory(20, 4) != prompts
    assert factory(5, 3) == prompts[:5]  # a larger count extends, never reshuffles


def test_held_out_rule_matches_the_zoo_definition():
    for path in ("traceback.py", "xml/dom/minidom.py", "os.py", "json/decoder.py"):
        expected = int(hashlib.sha256(path.encode("utf-8")).hexdigest(), 16) % 20 == 0
        assert workloads.is_held_out(path) is expected
    assert workloads.is_held_out("traceback.py") and not workloads.is_held_out("os.py")


def test_every_code_prompt_comes_from_a_held_out_file():
    root = workloads.stdlib_dir()
    for prompt in workloads.code_prompts(60, 0):
        assert workloads.is_held_out(prompt.path), prompt.path
        assert "site-packages" not in prompt.path
        source = (root / prompt.path).read_text(encoding="utf-8")
        first_line = prompt.text.splitlines()[0].strip()
        assert source.splitlines()[prompt.line - 1].strip() == first_line


def test_code_prompts_open_a_function_and_fit_the_token_bounds():
    for prompt in workloads.code_prompts(60, 0):
        assert prompt.text.lstrip().startswith(("def ", "async def ", "@"))
        assert workloads.MIN_PROMPT_TOKENS <= workloads.count_tokens(prompt.text) <= workloads.MAX_PROMPT_TOKENS


def test_count_beyond_the_distinct_prompts_repeats_in_order():
    distinct = len(workloads.code_candidates())
    prompts = workloads.code_workload(distinct + 3, 1)
    assert len(set(prompts)) == distinct and prompts[distinct:] == prompts[:3]


def test_rare_differs_from_code_and_repeats_no_word():
    rare = workloads.rare_workload(10, 0)
    assert not set(rare) & set(workloads.code_workload(10, 0))
    for prompt in rare:
        words = prompt.rstrip(".").lower().split()
        assert len(words) == len(set(words)) == workloads.RARE_PROMPT_WORDS


def test_missing_stdlib_sources_is_one_clear_error(tmp_path):
    with pytest.raises(SpdflowError, match="needs the Python standard library sources"):
        workloads.code_candidates(tmp_path)


# ------------------------------------------------------------------------------ evaluation-only sets


def _source_line(root, prompt) -> str:
    return (root / prompt.path).read_text(encoding="utf-8").splitlines()[prompt.line - 1].strip()


def test_stdlib_tests_prompts_come_from_held_out_test_modules_that_code_never_uses():
    root = workloads.stdlib_dir()
    test_files = set(workloads.held_out_test_files())
    assert test_files and not test_files & set(workloads.held_out_files())
    code_files = {p.path for p in workloads.code_candidates()}
    for prompt in workloads.stdlib_test_candidates():
        assert prompt.path in test_files and workloads.is_held_out(prompt.path)
        assert prompt.path not in code_files
        parts = prompt.path.split("/")
        assert set(parts[:-1]) & {"test", "tests", "idle_test"} or parts[-1].startswith("test_"), prompt.path
    for prompt in _seeded_prompts(workloads.stdlib_test_candidates(), 30):
        assert _source_line(root, prompt) == prompt.text.splitlines()[0].strip()


def test_thirdparty_prompts_come_from_the_named_packages_and_not_the_stdlib():
    code_texts = set(workloads.code_workload(200, 0))
    for prompt in _seeded_prompts(workloads.thirdparty_candidates(), 30):
        package = prompt.path.split("/")[0]
        assert package in workloads.THIRDPARTY_PACKAGES
        root = workloads._package_dir(package).parent
        assert _source_line(root, prompt) == prompt.text.splitlines()[0].strip()
        assert prompt.text not in code_texts
    assert all(workloads.thirdparty_versions()[p] for p in workloads.THIRDPARTY_PACKAGES)


def _seeded_prompts(candidates, count):
    return workloads._seeded_pick(candidates, count, 0)


@pytest.mark.parametrize("name", workloads.EVALUATION_ONLY)
def test_evaluation_prompts_open_a_function_and_fit_the_embedded_models_context(name):
    import yaml

    recipe = yaml.safe_load((Path(__file__).parents[2] / "recipes" / "tinycode_varK.yaml").read_text())
    room = recipe["specialization"]["ctx_len"] - recipe["workload"]["max_new_tokens"]
    prompts = getattr(workloads, f"{name}_workload")(40, 0)
    assert len(set(prompts)) == 40
    for text in prompts:
        assert text.lstrip().startswith(("def ", "async def ", "@"))
        tokens = workloads.count_tokens(text)
        assert workloads.MIN_PROMPT_TOKENS <= tokens <= workloads.MAX_PROMPT_TOKENS
        assert tokens <= room


def test_prompts_digest_is_stable_and_tells_prompt_sets_apart():
    a = workloads.thirdparty_workload(8, 0)
    assert workloads.prompts_digest(a) == workloads.prompts_digest(list(a))
    assert workloads.prompts_digest(a) != workloads.prompts_digest(workloads.thirdparty_workload(8, 1))
    assert len(workloads.prompts_digest([[{"role": "user", "content": "x"}]])) == 64


def test_missing_stdlib_test_modules_is_one_clear_error(tmp_path):
    (tmp_path / "os.py").write_text("def f():\n    pass\n")
    with pytest.raises(SpdflowError, match="needs the Python standard library's test modules"):
        workloads.stdlib_test_candidates(tmp_path)


def test_missing_thirdparty_packages_is_one_clear_error():
    with pytest.raises(SpdflowError, match="found no Python sources in the packages"):
        workloads.thirdparty_candidates(("no_such_package_spdflow",))
