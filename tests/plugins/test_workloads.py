"""The built-in workloads (plugins/spdflow_workloads): determinism, held-out split, counts."""
from __future__ import annotations

import hashlib

import pytest

import spdflow_workloads as workloads
from spdflow.errors import SpdflowError
from spdflow.plugins import SpdflowPluginManager


def test_registers_code_rare_chat_edit_and_qa():
    pm = SpdflowPluginManager()
    pm.add_plugin(workloads, "workloads")
    assert set(pm.registry()["workload"]) == {"code", "rare", "chat", "edit", "qa"}
    assert all(r.description for r in pm.registry()["workload"].values())


@pytest.mark.parametrize("name", ["code", "rare", "chat"])
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
