"""Paths in a recipe stay inside the recipe's folder unless the user opts in.

A recipe that arrives in a pull request and runs in CI must not read whatever the process can
(``workload.file: /etc/shadow`` would end up in outputs.jsonl and an uploaded report). So every
local path a recipe names — ``model.id``, a proposer's ``model``, ``workload.file`` — is
resolved (symlinks followed) and must land inside the recipe's folder tree. Reading outside it
needs ``--allow-outside-paths`` on the command line (never a recipe field: the recipe is the
untrusted part); ``spdflow lint`` warns about every such path (SPD112).
"""
from __future__ import annotations

from pathlib import Path

from spdflow.errors import RecipeError

ALLOW_FLAG = "--allow-outside-paths"


class PathOutsideRecipeError(RecipeError):
    """A recipe path resolves outside the recipe's folder and reading outside was not allowed."""


def outside_recipe(path: Path, base_dir: Path) -> Path | None:
    """The resolved ``path`` when it lies outside ``base_dir``'s tree, else None."""
    resolved = Path(path).expanduser().resolve()
    root = Path(base_dir).resolve()
    if resolved == root or root in resolved.parents:
        return None
    return resolved


def confine(path: Path, base_dir: Path, *, key: str, allow_outside: bool) -> Path:
    """``path`` resolved; a PathOutsideRecipeError when it leaves the recipe's folder (unless allowed)."""
    outside = outside_recipe(path, base_dir)
    if outside is None or allow_outside:
        return Path(path).expanduser().resolve()
    raise PathOutsideRecipeError(
        f"{key} resolves to '{outside}', outside the recipe's folder '{Path(base_dir).resolve()}'",
        hint=f"recipes read only files inside their own folder; move the file there, or pass {ALLOW_FLAG} "
             "if you trust this recipe")
