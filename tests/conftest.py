"""Shared fixtures: a fresh plugin manager per test and a recipe writer."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from spdflow.plugins import get_plugin_manager

REPO = Path(__file__).resolve().parents[1]

MINIMAL = """\
version: 1
name: t
model:
  id: spdflow:tinycode-target
proposer:
  uses: prompt_lookup
num_speculative_tokens: [0, 4]
workload:
  prompts: ["def f(x):"]
  max_new_tokens: 8
"""


@pytest.fixture
def pm():
    return get_plugin_manager()


@pytest.fixture
def write_recipe(tmp_path):
    def write(text: str = MINIMAL, name: str = "recipe.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write
