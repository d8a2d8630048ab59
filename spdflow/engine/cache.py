"""Content-hash cache keys and verified done markers for stage outputs.

A stage's key is the sha256 of canonical JSON of (implementation, version, config, input
digests): the same logical recipe gives the same key whatever the YAML key order. A finished
output directory holds ``.spdflow-done.json`` listing its files with sha256, size and mtime; an
output without it, or whose files no longer match, is not trusted (a warning, then a rebuild).
Checking is fast: only files whose size or mtime changed are hashed again (all with ``verify``).
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator

from spdflow.files import canonical_json, sha256_file, sha256_text, write_json_atomic

DONE_MARKER = ".spdflow-done.json"
KEY_SCHEMA = 1
#: files above this size are identified by size and mtime instead of a full sha256
FULL_HASH_LIMIT = 256 * 1024 * 1024
#: the layout of done markers; a marker of another format is not trusted
MARKER_FORMAT = 2


def stage_key(impl: str, version: str, config: Any, inputs: dict[str, str]) -> str:
    """The full sha256 hex key of one stage invocation."""
    payload = {"key_schema": KEY_SCHEMA, "impl": impl, "version": version, "config": config, "inputs": inputs}
    return sha256_text(canonical_json(payload))


def file_digest(path: Path) -> str:
    """sha256 of a file, or ``size:mtime`` identity for very large files (model shards)."""
    stat = path.stat()
    if stat.st_size > FULL_HASH_LIMIT:
        return f"stat:{stat.st_size}:{stat.st_mtime_ns}"
    return sha256_file(path)


def dir_digest(path: Path, patterns: tuple[str, ...] = ("*",)) -> dict[str, str]:
    """Digests of the files directly in ``path`` matching ``patterns``."""
    files = sorted({p for pattern in patterns for p in path.glob(pattern) if p.is_file() and p.name != DONE_MARKER})
    return {p.name: file_digest(p) for p in files}


def file_record(path: Path) -> dict[str, Any]:
    """What a done marker keeps about one file: its sha256, size and modification time."""
    stat = path.stat()
    return {"sha256": sha256_file(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def write_done(directory: Path, extra: dict[str, Any] | None = None) -> None:
    """Record every file under ``directory`` with its hash, size and mtime: the output is complete."""
    files = {
        str(p.relative_to(directory)): file_record(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != DONE_MARKER
    }
    write_json_atomic(directory / DONE_MARKER, {"marker_format": MARKER_FORMAT, "files": files, **(extra or {})})


def read_done(directory: Path, *, verify: bool = False) -> tuple[dict[str, Any] | None, str]:
    """(marker, "") when ``directory`` is complete and intact, else (None, why not).

    A file whose size and mtime still match its record is trusted without reading it (the fast
    path); one whose mtime changed is hashed in full, and so is every file when ``verify``.
    A file that changed its mtime but not its content gets its record refreshed, so the next
    check is fast again.
    """
    marker_path = directory / DONE_MARKER
    if not directory.is_dir():
        return None, "not built yet"
    if not marker_path.is_file():
        return None, "a previous build did not finish"
    try:
        marker = json.loads(marker_path.read_text())
        files = marker["files"]
        if marker.get("marker_format") != MARKER_FORMAT:
            return None, "its done marker is from an older spdflow"
        records = [(name, record["sha256"], record["size"], record["mtime_ns"]) for name, record in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None, "its done marker is unreadable"
    refreshed = False
    for name, digest, size, mtime_ns in records:
        path = directory / name
        try:
            stat = path.stat()
        except OSError:
            return None, f"'{name}' is missing"
        if not path.is_file():
            return None, f"'{name}' is missing"
        if stat.st_size != size:
            return None, f"'{name}' changed size since it was built ({size} -> {stat.st_size} bytes)"
        if verify or stat.st_mtime_ns != mtime_ns:
            try:
                actual = sha256_file(path)
            except OSError as exc:
                return None, f"'{name}' cannot be read ({exc.strerror or exc})"
            if actual != digest:
                return None, f"'{name}' does not match its recorded hash"
            if stat.st_mtime_ns != mtime_ns:
                files[name]["mtime_ns"] = stat.st_mtime_ns
                refreshed = True
    if refreshed:
        try:
            write_json_atomic(marker_path, marker)
        except OSError:
            pass  # a read-only cache is still trusted; it is only hashed again next time
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
    name = sha256_text(str(Path(target).resolve()))[:32]
    with open(locks / f"{name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
