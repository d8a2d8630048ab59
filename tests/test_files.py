"""spdflow.files: the one module for hashing, canonical JSON and atomic writes."""
from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest

from spdflow import files


def test_canonical_json_and_short_hash_follow_qefficient():
    assert files.canonical_json({"b": [1, 2], "a": "x"}) == '{"a":"x","b":[1,2]}'
    assert files.short_hash({"b": [1, 2], "a": "x"}) == hashlib.sha256(b'{"a":"x","b":[1,2]}').hexdigest()[:16]
    assert files.sha256_text("é") == hashlib.sha256("é".encode()).hexdigest()
    with pytest.raises(ValueError):
        files.canonical_json({"a": float("nan")})


def test_sha256_file_matches_hashlib(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"x" * (3 << 20))
    assert files.sha256_file(path) == hashlib.sha256(b"x" * (3 << 20)).hexdigest()


def test_writes_leave_only_the_target_with_mode_0644_or_the_mode_asked(tmp_path):
    files.write_json_atomic(tmp_path / "a.json", {"b": 1, "a": 2})
    files.write_text_atomic(tmp_path / "run.sh", "echo\n", mode=0o755)
    files.write_bytes_atomic(tmp_path / "p.png", b"\x89PNG")
    files.write_jsonl_atomic(tmp_path / "t.jsonl", [{"a": 1}, {"b": 2}])
    text = (tmp_path / "a.json").read_text()
    assert json.loads(text) == {"a": 2, "b": 1} and text == '{\n  "a": 2,\n  "b": 1\n}\n'
    assert (tmp_path / "t.jsonl").read_text() == '{"a": 1}\n{"b": 2}\n'
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"a.json": 0o644, "run.sh": 0o755, "p.png": 0o644, "t.jsonl": 0o644}


def test_a_failed_write_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "x.json"
    files.write_text_atomic(target, "old")

    def boom(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        files.write_text_atomic(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_atomic_dir_replaces_an_incomplete_target_and_cleans_up_on_failure(tmp_path):
    target = tmp_path / "qpc-0"
    target.mkdir()
    (target / "partial").write_text("x")
    with files.atomic_dir(target) as work:
        assert work.parent == tmp_path and work != target
        (work / "done").write_text("y")
    assert [p.name for p in target.iterdir()] == ["done"]
    with pytest.raises(RuntimeError):
        with files.atomic_dir(tmp_path / "qpc-1") as work:
            (work / "half").write_text("z")
            raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qpc-0"]


def test_no_other_module_writes_via_its_own_temp_and_rename():
    """Every tmp-then-rename and canonical-JSON hash in spdflow and its built-in plugins goes
    through spdflow.files (the one place; others drifted before: indent 4 vs 2, default=str)."""
    from pathlib import Path

    root = Path(files.__file__).resolve().parents[1]
    offenders = []
    for path in [*(root / "spdflow").rglob("*.py"), *(root / "plugins").glob("spdflow_*/*.py")]:
        if path.name == "files.py" and path.parent.name == "spdflow":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "indent=" in line:  # a file layout a backend owns (QEfficient's), not a hash text
                continue
            for needle in ("os.replace(", "tempfile.mkstemp(", "tempfile.mkdtemp(", 'separators=(",", ":")'):
                if needle in line:
                    offenders.append(f"{path.relative_to(root)}:{number}: {needle}")
    assert offenders == []
