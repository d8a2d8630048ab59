"""The Ray executor: a local Ray instance (num_cpus=2) runs the 2x2 sweep with the local
executor's tokens; device needs become Ray resources; without Ray, one sentence."""
from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from spdflow.cli import cli
from spdflow.sweep.executors import RayExecutor, Task
from spdflow.sweep.run import SweepOptions, load_sweep, point_needs, run_sweep
from spdflow.sweep.spec import read_sweep


@pytest.fixture(scope="session")
def ray_instance():
    """One local Ray instance for the session, shut down (with its processes) at the end."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install \"spdflow[ray]\")")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def test_ray_executor_gives_the_local_executors_tokens(ray_instance, local_sweep, tmp_path, sweep_file, pm):
    assert local_sweep["result"].exit_code == 0, local_sweep["result"].output
    local = {p["label"]: p for p in json.loads(local_sweep["result"].stdout)["points"]}
    path = sweep_file(tmp_path, tmp_path / "out")
    result = run_sweep(pm, load_sweep(path, pm), SweepOptions(executor="ray"), quiet=True)
    assert result.status == "ok" and result.executor == "ray"
    assert {p.label for p in result.points} == set(local)
    for point in result.points:
        assert point.ran == "now" and point.status == "ok" and point.metrics.lossless is True, point
        assert point.outputs_sha256 is not None and point.outputs_sha256 == local[point.label]["outputs_sha256"]
    sweep = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert sweep["executor"] == "ray" and (tmp_path / "out" / "sweep.html").is_file()


def test_ray_resources_follow_the_device_ids(tmp_path, pm):
    (tmp_path / "base.yaml").write_text(
        "version: 1\nname: b\nmodel: {id: spdflow:tinycode-target}\nproposer: {uses: prompt_lookup}\n"
        "num_speculative_tokens: [0, 4]\nworkload: {prompts: [x], max_new_tokens: 4}\n")
    (tmp_path / "sweep.yaml").write_text(
        "version: 1\nname: s\nbase: base.yaml\nmatrix:\n"
        "  devices: [{backend: qaic, device_ids: [0, 1, 2, 3]}, {backend: onnxruntime}]\n")
    loaded = read_sweep(tmp_path / "sweep.yaml", pm)
    assert loaded.errors == []
    qaic, ort = (point_needs(p, pm) for p in loaded.points)
    assert qaic.ray_resources() == {"qaic": 4.0} and qaic.device_ids == (0, 1, 2, 3)
    assert ort.ray_resources() == {} and ort.device_ids == ()
    executor = RayExecutor.__new__(RayExecutor)  # only the resource check, no cluster
    why = executor._missing(Task("q", {}, qaic), {"CPU": 8.0})
    assert "needs 4 'qaic' units (device ids [0, 1, 2, 3])" in why and "ray start --resources" in why
    assert executor._missing(Task("q", {}, qaic), {"CPU": 8.0, "qaic": 4.0}) is None


def test_executor_ray_without_ray_says_so_in_one_sentence(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    result = CliRunner().invoke(cli, ["sweep", "recipes/sweeps/tinycode_klists.yaml", "--executor", "ray"])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == (
        "Error: --executor ray needs Ray, which is not installed here; install it with "
        "`pip install \"spdflow[ray]\"` (or `pip install ray`), or use the local executor")
