"""Cache keys are content hashes; done markers make half-written outputs untrusted."""
from __future__ import annotations

from spdflow.engine import cache
from spdflow.recipe.loader import load_recipe


def test_key_is_stable_when_yaml_key_order_changes(write_recipe, pm):
    a = load_recipe(write_recipe("version: 1\nname: t\nmodel: {id: x, dtype: float16}\nworkload: {builtin: code, count: 3}\n", "a.yaml"), pm)
    b = load_recipe(write_recipe("workload: {count: 3, builtin: code}\nmodel: {dtype: float16, id: x}\nname: t\nversion: 1\n", "b.yaml"), pm)
    key = lambda loaded: cache.stage_key("impl", "1", loaded.recipe.model_dump(mode="json"), {"w": "abc"})
    assert key(a) == key(b)


def test_key_changes_with_config_inputs_and_version():
    base = cache.stage_key("impl", "1", {"a": 1}, {"w": "abc"})
    assert cache.stage_key("impl", "1", {"a": 2}, {"w": "abc"}) != base
    assert cache.stage_key("impl", "1", {"a": 1}, {"w": "abd"}) != base
    assert cache.stage_key("impl", "2", {"a": 1}, {"w": "abc"}) != base


def test_done_marker_detects_corruption(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.onnx").write_bytes(b"graph")
    assert cache.read_done(out)[0] is None  # never finished
    cache.write_done(out, {"onnx": "model.onnx"})
    marker, why = cache.read_done(out)
    assert marker["onnx"] == "model.onnx" and why == ""
    (out / "model.onnx").write_bytes(b"grapH")
    marker, why = cache.read_done(out)
    assert marker is None and "does not match" in why
    (out / "model.onnx").unlink()
    assert "missing" in cache.read_done(out)[1]


def test_done_marker_hashes_only_files_whose_size_or_mtime_changed(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "w.bin").write_bytes(b"weights")
    cache.write_done(out)
    hashed = []
    real = cache.sha256_file
    monkeypatch.setattr(cache, "sha256_file", lambda path: hashed.append(path.name) or real(path))
    assert cache.read_done(out)[0] is not None and hashed == []  # fast path: stat only
    assert cache.read_done(out, verify=True)[0] is not None and hashed == ["w.bin"]  # --verify hashes


def test_done_marker_catches_damage_that_kept_the_size_and_refreshes_a_mere_touch(tmp_path):
    import os

    out = tmp_path / "out"
    out.mkdir()
    weights = out / "w.bin"
    weights.write_bytes(b"\1" * 4096)
    cache.write_done(out)
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched, same bytes
    assert cache.read_done(out)[0] is not None
    assert cache.read_done(out)[0]["files"]["w.bin"]["mtime_ns"] == stat.st_mtime_ns + 10**9
    weights.write_bytes(b"\0" * 1024 + b"\1" * 3072)  # damaged in place, same size
    marker, why = cache.read_done(out)
    assert marker is None and "'w.bin' does not match its recorded hash" in why
    stat = weights.stat()
    cache.write_done(out)
    weights.write_bytes(b"\1" * 4096)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # damage that hides its mtime
    assert cache.read_done(out)[0] is not None  # only --verify can see it
    assert "does not match" in cache.read_done(out, verify=True)[1]


def test_a_marker_of_an_older_format_is_not_trusted(tmp_path):
    import json

    out = tmp_path / "out"
    out.mkdir()
    (out / "model.onnx").write_bytes(b"graph")
    (out / cache.DONE_MARKER).write_text(json.dumps({"files": {"model.onnx": cache.sha256_file(out / "model.onnx")}}))
    marker, why = cache.read_done(out)
    assert marker is None and "older spdflow" in why
