"""Finding a model on this machine: embedded, local directory, or the local HF cache. Never the network."""
from __future__ import annotations

import os
from pathlib import Path

from spdflow import zoo
from spdflow.errors import StageError


class ModelNotFoundError(StageError):
    """The model is neither embedded, a local directory, nor in the local HF cache."""


def resolve_model_dir(model_id: str, base_dir: Path, revision: str | None = None, *, key: str = "model.id",
                      allow_outside: bool = False) -> Path:
    """The local directory of ``model_id``; one sentence when it is not on this machine.

    ``key`` is the recipe key that names the model (``proposer.with.model`` for a draft), for hints.
    A local directory must lie inside ``base_dir`` (the recipe's folder) unless ``allow_outside``."""
    if model_id.startswith(zoo.PREFIX):
        return zoo.zoo_path(model_id)
    # A relative path means the recipe's folder, never the current directory (DESIGN §6).
    candidate = base_dir / Path(model_id).expanduser()
    if candidate.is_dir():
        from spdflow.recipe.paths import confine

        resolved = confine(candidate, base_dir, key=f"{key} '{model_id}'", allow_outside=allow_outside)
        if not (candidate / "config.json").is_file():
            raise ModelNotFoundError(f"model directory '{candidate}' has no config.json",
                                     hint=f"point {key} at a Hugging Face model folder")
        return resolved
    cached = _from_hf_cache(model_id, revision)
    if cached is not None:
        return cached
    looks_local = model_id.startswith((".", "/", "~")) or model_id.count("/") != 1
    if looks_local:
        raise ModelNotFoundError(f"model '{model_id}' is not a directory (relative paths are resolved against '{base_dir}')",
                                 hint=f"fix {key} (e.g. spdflow:tinycode-target)")
    raise ModelNotFoundError(
        f"model '{model_id}' is not in the local Hugging Face cache and spdflow does not download",
        hint=f"on a machine with network run `hf download {model_id}` (or set HF_HOME to a cache holding it), "
             f"or point {key} at a local directory",
    )


def _from_hf_cache(model_id: str, revision: str | None) -> Path | None:
    """The snapshot folder of a hub id in the local cache, without any network access."""
    if model_id.count("/") != 1:
        return None
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
    repo = hub / ("models--" + model_id.replace("/", "--"))
    if not repo.is_dir():
        return None
    ref = revision or "main"
    ref_file = repo / "refs" / ref
    commit = ref_file.read_text().strip() if ref_file.is_file() else ref
    snapshot = repo / "snapshots" / commit
    if (snapshot / "config.json").is_file():
        return snapshot
    return None
