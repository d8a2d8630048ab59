"""The embedded models: small Llama code LMs shipped inside the package.

A recipe names them as ``spdflow:<name>``; ``zoo_path`` finds the folder.
"""
from __future__ import annotations

from pathlib import Path

from spdflow.errors import RecipeError

PREFIX = "spdflow:"
ZOO_DIR = Path(__file__).resolve().parent


def names() -> list[str]:
    """The embedded model names."""
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "config.json").is_file())


def zoo_path(name: str) -> Path:
    """The folder of embedded model ``name`` (with or without the ``spdflow:`` prefix)."""
    bare = name[len(PREFIX):] if name.startswith(PREFIX) else name
    path = ZOO_DIR / bare
    if not (path / "config.json").is_file():
        raise RecipeError(
            f"there is no embedded model '{bare}'",
            hint=f"embedded models: {', '.join(PREFIX + n for n in names())}",
        )
    return path
