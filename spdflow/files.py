"""The one place spdflow writes files and hashes things.

- ``canonical_json``: the one JSON text hashes are taken over (sorted keys, no spaces, no NaN);
  ``sha256_text``/``short_hash``/``sha256_file``: the hashes over it and over files.
- ``write_text_atomic``/``write_bytes_atomic``/``write_json_atomic``: a temp file in the same
  directory renamed over the target, so a reader never sees half of one; files are 0644 unless
  the caller asks otherwise (0755 for scripts); JSON is indented by ``JSON_INDENT`` with sorted keys.
- ``atomic_dir``: a temp directory that becomes the target only when the block succeeds.

Formats a backend owns (QEfficient's 4-space ``specializations.json``, ``custom_io.yaml``) live in
that backend's plugin; this module only knows how to get bytes onto disk safely.
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

#: the indentation of every JSON file spdflow writes for people (reports, markers, tables)
JSON_INDENT = 2
#: the mode of every file spdflow writes (temp files are created 0600)
FILE_MODE = 0o644


# -------------------------------------------------------------------------------------- hashing


def canonical_json(obj: Any) -> str:
    """The one JSON text of ``obj`` that hashes are taken over (sorted keys, no spaces, no NaN).

    Values JSON has no type for (paths, enums) are written as their ``str``.
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False, default=str)


def sha256_text(text: str) -> str:
    """Hex SHA-256 of ``text`` encoded as UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def short_hash(obj: Any) -> str:
    """The first 16 hex digits of the SHA-256 of ``canonical_json(obj)`` (QEfficient's rule)."""
    return sha256_text(canonical_json(obj))[:16]


def sha256_file(path: Path | str) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks (weights can be gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------------- atomic writes


def write_bytes_atomic(path: Path | str, data: bytes, *, mode: int = FILE_MODE) -> Path:
    """Write ``data`` to ``path`` through a temp file in the same directory, then rename it.

    ``mode`` is applied before the rename, e.g. 0o755 for scripts. On any failure the temp file
    is removed and an existing ``path`` keeps its old content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def write_text_atomic(path: Path | str, text: str, *, mode: int = FILE_MODE) -> Path:
    """:func:`write_bytes_atomic` of ``text`` as UTF-8 (newlines written as ``\\n`` on every OS)."""
    return write_bytes_atomic(path, text.encode("utf-8"), mode=mode)


def json_text(obj: Any) -> str:
    """``obj`` as the JSON text spdflow writes to files: indented, sorted keys, trailing newline."""
    return json.dumps(obj, indent=JSON_INDENT, sort_keys=True, allow_nan=False, default=str) + "\n"


def write_json_atomic(path: Path | str, obj: Any) -> Path:
    """Write ``obj`` as :func:`json_text`, atomically."""
    return write_text_atomic(path, json_text(obj))


def write_jsonl_atomic(path: Path | str, rows: list[Any]) -> Path:
    """Write one compact JSON object per line, atomically."""
    return write_text_atomic(path, "".join(json.dumps(row, default=str) + "\n" for row in rows))


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
