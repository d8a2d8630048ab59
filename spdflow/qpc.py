"""Hashing and atomic writes shared by the engine and every backend.

``canonical_json`` is the one JSON text hashes are taken over; ``short_hash`` names a compiled
program directory (``qpc-<hash>/``). Writes go through a temp file or directory renamed into
place, so a reader never sees half of one.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


# -------------------------------------------------------------------------------------- hashing


def canonical_json(obj: Any) -> str:
    """The one JSON text of ``obj`` that hashes are taken over (sorted keys, no spaces, no NaN)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def short_hash(obj: Any) -> str:
    """The first 16 hex digits of the SHA-256 of ``canonical_json(obj)`` (QEfficient's rule)."""
    return hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()[:16]


# ---------------------------------------------------------------------------- atomic writes


def write_text_atomic(path: Path | str, text: str, *, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` via a temp file in the same dir, so readers never see half of it.

    ``mode`` is applied before the rename (temp files are created 0600), e.g. 0o755 for scripts.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: Path | str, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON (as QEfficient's create_json does), atomically."""
    write_text_atomic(path, json.dumps(obj, indent=4, sort_keys=True, allow_nan=False) + "\n")


@contextlib.contextmanager
def atomic_dir(target: Path | str) -> Iterator[Path]:
    """Yield a fresh temp dir next to ``target``; on success it becomes ``target``.

    An existing ``target`` is replaced: callers only enter this when the target is missing or
    incomplete. On any exception the temp dir is deleted and the exception propagates, so a
    half-built directory is never found under the target name.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    os.chmod(work, 0o755)  # mkdtemp makes 0700; the result is a shared cache entry
    try:
        yield work
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    os.replace(work, target)
