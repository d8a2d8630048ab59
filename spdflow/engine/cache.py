"""Content-hash cache keys and verified done markers for stage outputs.

A stage's key is the sha256 of canonical JSON of (implementation, version, config, input
digests): the same logical recipe gives the same key whatever the YAML key order. A finished
output directory holds ``.spdflow-done.json`` listing its files with their digests; an output
without it, or whose files no longer match, is not trusted (a warning, then a rebuild).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any, Iterator

from spdflow.qpc import write_text_atomic

DONE_MARKER = ".spdflow-done.json"
KEY_SCHEMA = 1
#: files above this size are identified by size and mtime instead of a full sha256
FULL_HASH_LIMIT = 256 * 1024 * 1024


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False, default=str)


def stage_key(impl: str, version: str, config: Any, inputs: dict[str, str]) -> str:
    """The full sha256 hex key of one stage invocation."""
    payload = {"key_schema": KEY_SCHEMA, "impl": impl, "version": version, "config": config, "inputs": inputs}
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (weights can be gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    """sha256 of a file, or ``size:mtime`` identity for very large files (model shards)."""
    stat = path.stat()
    if stat.st_size > FULL_HASH_LIMIT:
        return f"stat:{stat.st_size}:{stat.st_mtime_ns}"
    return sha256_file(path)


def dir_digest(path: Path, patterns: tuple[str, ...] = ("*",)) -> dict[str, str]:
    """Digests of the files directly in ``path`` matching ``patterns``."""
    files = sorted({p for pattern in patterns for p in path.glob(pattern) if p.is_file()})
    return {p.name: file_digest(p) for p in files}


def write_done(directory: Path, extra: dict[str, Any] | None = None) -> None:
    """Record every file under ``directory`` with its digest: the output is complete."""
    files = {
        str(p.relative_to(directory)): file_digest(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != DONE_MARKER
    }
    write_json_atomic(directory / DONE_MARKER, {"files": files, **(extra or {})})


def read_done(directory: Path) -> tuple[dict[str, Any] | None, str]:
    """(marker, "") when ``directory`` is complete and intact, else (None, why not)."""
    marker_path = directory / DONE_MARKER
    if not directory.is_dir():
        return None, "not built yet"
    if not marker_path.is_file():
        return None, "a previous build did not finish"
    try:
        marker = json.loads(marker_path.read_text())
        files = marker["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, "its done marker is unreadable"
    for name, digest in files.items():
        path = directory / name
        if not path.is_file():
            return None, f"'{name}' is missing"
        if file_digest(path) != digest:
            return None, f"'{name}' does not match its recorded hash"
    return marker, ""


@contextlib.contextmanager
def build_lock(target: Path, *, wait: bool = True) -> Iterator[None]:
    """Hold an exclusive lock on building ``target`` while the block runs (``wait=False``:
    raise BlockingIOError at once when another process holds it).

    Runs that share a cache (the points of a sweep) may want the same output at once: the
    first builds it, the others wait here and then find it complete. Callers check for a
    finished output *inside* the block. The lock is ``flock`` on a file named after the
    target's absolute path in the system temp dir (so cache folders hold only their entries),
    released by the kernel if the holder dies: a killed build never blocks a rerun. It
    serializes processes of one host; where ``fcntl`` does not exist (Windows) the block runs
    unlocked.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    import os
    import tempfile

    locks = Path(tempfile.gettempdir()) / f"spdflow-locks-{os.getuid()}"
    locks.mkdir(mode=0o700, exist_ok=True)
    name = hashlib.sha256(str(Path(target).resolve()).encode()).hexdigest()[:32]
    with open(locks / f"{name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


__all__ = ["write_text_atomic"]  # re-exported: one atomic writer for the whole project
