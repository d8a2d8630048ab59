"""The functions behind spdflow's pytest fixtures, usable without pytest.

Everything runs through the real plugin manager and ``Engine``: a test exercises the same
export, compile (onnxruntime) and generation code as ``spdflow run``.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from spdflow.recipe.schema import DEFAULT_BACKEND, REFERENCE_POLICY

#: Small code prompts with repeated phrases, so model-free proposers have something to propose.
CODE_PROMPTS = (
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
    "import os\nimport sys\nimport os.path\nimport sys",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\nfor k in range",
    "class Stack:\n    def push(self, item):\n        self.items.append(item)\n    def pop(self):",
)


def fresh_plugin_manager(*plugins: Any, load_entry_points: bool = True):
    """A new plugin manager (entry points loaded) plus ``plugins``, each a module or object
    with ``@hookimpl`` functions, registered in-process unless already loaded."""
    from spdflow.plugins import get_plugin_manager

    pm = get_plugin_manager(load_entry_points=load_entry_points)
    for plugin in plugins:
        if not pm.is_registered(plugin):
            pm.add_plugin(plugin, getattr(plugin, "__name__", type(plugin).__name__))
    return pm


def write_recipe(path: Path, recipe: dict) -> Path:
    """Write ``recipe`` (a dict) as YAML — JSON is YAML — and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# written by spdflow.testing\n" + json.dumps(recipe, indent=2) + "\n")
    return path


def tiny_recipe(model_dir: Path, output_dir: Path, *, proposer: dict | None = None, k_list: Iterable[int] = (0, 4),
                batch_size: int = 1, full_batch_size: int | None = None, prompts: Iterable[str] = CODE_PROMPTS[:2],
                max_new_tokens: int = 16, k_policy: str = REFERENCE_POLICY, name: str = "tiny") -> dict:
    """A recipe for a tiny model on onnxruntime: short context, small prefill chunks."""
    specialization = {"prefill_seq_len": 16, "ctx_len": 128, "batch_size": batch_size}
    if full_batch_size is not None:
        specialization["full_batch_size"] = full_batch_size
    recipe = {
        "version": 1,
        "name": name,
        "model": {"id": str(model_dir)},
        "num_speculative_tokens": list(k_list),
        "k_policy": k_policy,
        "specialization": specialization,
        "devices": {"backend": DEFAULT_BACKEND, "with": {"threads": 1}},
        "workload": {"prompts": list(prompts), "max_new_tokens": max_new_tokens},
        "output": str(output_dir),
    }
    if proposer is not None:
        recipe["proposer"] = proposer
    return recipe


def run_in_process(pm, recipe_path: Path, *, check_lossless: bool = True):
    """Run a recipe file through the real ``Engine``; returns its ``RunState`` (outputs,
    trace records, lossless check). Raises ``SpdflowError`` like ``spdflow run``."""
    from spdflow.engine.run import Engine, RunOptions
    from spdflow.recipe.loader import load_recipe

    # These helpers write their own recipes next to models made elsewhere: trusted paths.
    loaded = load_recipe(recipe_path, pm, allow_outside_paths=True)
    return Engine(pm, loaded, RunOptions(check_lossless=check_lossless)).run()


@dataclass
class TinyProgram:
    """A tiny model exported and compiled for onnxruntime by the real engine."""

    model_dir: Path
    run_dir: Path
    program: Any  # spdflow.api.CompiledProgram
    info: Any  # spdflow.api.ModelInfo
    k_list: list[int]
    pm: Any = field(repr=False, default=None)
    _engine: Any = field(repr=False, default=None)

    def open_session(self):
        """A new onnxruntime session on the program (closed with the program's engine)."""
        return self._engine.open_session(self.program)

    def close(self) -> None:
        self._engine.close_sessions()


def build_tiny_program(model_dir: Path, work_dir: Path, k_list: Iterable[int] = (0, 4)) -> TinyProgram:
    """Export, specialize and compile ``model_dir`` with the engine's own stages (cached in
    ``work_dir``)."""
    from spdflow.engine.run import Engine, RunOptions
    from spdflow.recipe.loader import load_recipe

    pm = fresh_plugin_manager()
    path = write_recipe(work_dir / "tiny_program.yaml", tiny_recipe(model_dir, work_dir / "run", k_list=k_list))
    engine = Engine(pm, load_recipe(path, pm, allow_outside_paths=True), RunOptions())
    recipe = engine.recipe
    program, info = engine.build_model(recipe.model, "target", recipe.k_list(), recipe.devices)
    return TinyProgram(Path(model_dir), engine.run_dir, program, info, recipe.k_list(), pm, engine)


def make_eos_variant(model_dir: Path, path: Path, eos_ids: Iterable[int]) -> Path:
    """A copy of ``model_dir`` whose EOS is every id in ``eos_ids``: with many EOS ids a random
    model emits one within a few tokens, so stopping inside a draft gets exercised."""
    shutil.copytree(model_dir, path, dirs_exist_ok=True)
    ids = sorted(set(int(i) for i in eos_ids))
    for name in ("config.json", "generation_config.json"):
        file = path / name
        if file.is_file():
            data = json.loads(file.read_text())
            data["eos_token_id"] = ids
            file.write_text(json.dumps(data, indent=2))
    return path
