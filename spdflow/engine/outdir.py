"""The output directory of a run: created with a clear error, locked, and cleaned of stale temps.

One advisory lock (``flock`` on ``.spdflow.lock``) per output dir: a second run into the same
dir stops at once with a message naming the process that holds it, instead of the two
overwriting each other's exports. The lock file records who holds it (pid, start time,
command); the kernel drops the lock when the process dies, even by kill -9, so a stale lock
file never blocks anyone. Holding the lock also makes it safe to remove the temp files and
dirs (``.<name>.<random>.tmp``) that an earlier killed run left behind.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

from spdflow.errors import StageError

LOCK_FILE = ".spdflow.lock"


class OutputDirError(StageError):
    """The output directory cannot be created, written, or is in use by another run."""


class OutputDirLock:
    """The advisory lock of one output dir, held for the whole run."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self._fd: int | None = None

    def acquire(self) -> "OutputDirLock":
        import fcntl

        path = self.run_dir / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise _os_error(self.run_dir, exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise _os_error(self.run_dir, exc) from exc
            raise OutputDirError(f"output dir '{self.run_dir}' is in use by another spdflow run ({_holder(path)})",
                                 hint="wait for that run to finish, or give this one another `output:` "
                                      "(e.g. --set output=runs/other)") from None
        holder = {"pid": os.getpid(), "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "command": " ".join(sys.argv)[:500]}
        try:
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps(holder) + "\n").encode())
        except OSError:
            pass  # the lock itself is what matters; the note about its holder is a courtesy
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return f"pid {info['pid']}, started {info['started_at']}: {info['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its pid is not recorded yet"


def _os_error(run_dir: Path, exc: OSError) -> OutputDirError:
    reason = {errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
              errno.EPERM: "permission denied", errno.ENOSPC: "the disk is full",
              errno.ENOTDIR: "a part of the path is a file, not a directory"}.get(exc.errno, exc.strerror or str(exc))
    return OutputDirError(f"cannot use the output dir '{run_dir}': {reason}",
                          hint="set `output:` (or --set output=...) to a writable directory")


def open_output_dir(run_dir: Path) -> OutputDirLock:
    """Create ``run_dir``, take its lock and remove stale temps; errors are one sentence."""
    text = str(run_dir)
    if "\0" in text:
        raise OutputDirError(f"the output dir {text!r} contains a NUL character",
                             hint="set `output:` to a plain directory path")
    if run_dir.exists() and not run_dir.is_dir():
        raise OutputDirError(f"the output dir '{run_dir}' is an existing file, not a directory",
                             hint="set `output:` to a directory, or move the file away")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise OutputDirError(f"cannot create the output dir '{run_dir}': a part of the path is a file",
                             hint="set `output:` to a directory path") from None
    except OSError as exc:
        raise _os_error(run_dir, exc) from exc
    lock = OutputDirLock(run_dir).acquire()
    try:
        remove_stale_temps(run_dir)
    except BaseException:
        lock.release()
        raise
    return lock


def remove_stale_temps(run_dir: Path) -> list[Path]:
    """Remove ``.*.tmp`` files and dirs an interrupted run left in the run dir, its export dir and
    each export (where programs are built). Only call this while holding the dir's lock."""
    removed = []
    export = run_dir / "export"
    places = [run_dir, export] + ([p for p in export.iterdir() if p.is_dir() and not p.is_symlink()]
                                  if export.is_dir() and not export.is_symlink() else [])
    for place in places:
        for entry in place.glob(".*.tmp"):
            try:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
                removed.append(entry)
            except OSError:
                pass  # not ours to fight over; it is never read as a cache entry
    return removed
