"""Interrupted runs: SIGKILL at seeded random moments never leaves a trusted half-written artifact.

``spdflow run`` runs in a subprocess on a tiny random-init Llama (through a small driver that
adds a 5 ms delay to every verify, so generation lasts long enough to be interrupted). It is
killed during export, compile and generation, each time resuming from what the previous one
left; then a final run must succeed, be lossless, and equal an uninterrupted run. A flipped
byte in a cached model.onnx is a warning and a rebuild; Ctrl-C exits 130 with a partial report.
"""
from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from spdflow.cli import cli
from spdflow.engine import cache

RECIPE = """\
version: 1
name: tiny
model:
  id: tiny
proposer:
  uses: prompt_lookup
num_speculative_tokens: [0, 2]
specialization:
  prefill_seq_len: 8
  ctx_len: 128
devices:
  backend: onnxruntime
  with: {threads: 1}
workload:
  prompts: ["def f(x):\\n    return x + 1\\n\\ndef g(x):", "import os\\nimport sys\\n", "for i in range(10):"]
  max_new_tokens: 60
output: out
"""

DRIVER = """\
import os
import sys
import time

import spdflow.plugins as plugins
from spdflow.hookspecs import hookimpl

real = plugins.get_plugin_manager
PAUSE = os.environ.get("SPDFLOW_TEST_PAUSE")
SWALLOW = os.environ.get("SPDFLOW_TEST_SWALLOW") == "1"


def pause(stage):
    # SPDFLOW_TEST_PAUSE=<stage>: say so and wait there, so a test can signal that stage.
    # SPDFLOW_TEST_SWALLOW=1: eat the interrupt, as a library's bare `except:` would.
    global PAUSE
    if PAUSE != stage:
        return
    PAUSE = None
    try:  # the signal can land as soon as the line is out
        print(f"PAUSE {stage}", file=sys.stderr, flush=True)
        time.sleep(5)
    except KeyboardInterrupt:
        if not SWALLOW:
            raise
        print("SWALLOWED", file=sys.stderr, flush=True)


class SlowVerify:
    @staticmethod
    @hookimpl(wrapper=True)
    def spdflow_verify(session, input_ids, position_ids, num_logits_to_keep, batch_index):
        pause("generate")
        time.sleep(0.005)
        return (yield)

    @staticmethod
    @hookimpl(wrapper=True)
    def spdflow_export(request):
        pause("export")
        return (yield)

    @staticmethod
    @hookimpl(wrapper=True)
    def spdflow_compile(request, backend):
        pause("compile")
        return (yield)

    @staticmethod
    @hookimpl
    def spdflow_after_run(recipe, run):
        pause("report")


def patched(**kwargs):
    pm = real(**kwargs)
    pm.add_plugin(SlowVerify, "slow_verify")
    return pm


plugins.get_plugin_manager = patched
from spdflow.cli import main

main()
"""

#: (stage, the stderr text that starts it, the range of the random delay after it, seconds)
KILLS = [
    ("export", "loading ", (0.0, 1.5)),
    ("compile", "building qpc", (0.0, 0.03)),
    ("generate", "compile: ", (0.0, 0.6)),
    ("generate", "compile: ", (0.3, 1.2)),
]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    from spdflow.testing.models import make_tiny_model

    root = tmp_path_factory.mktemp("interrupt")
    make_tiny_model(root / "tiny", num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1)
    (root / "recipe.yaml").write_text(RECIPE)
    (root / "driver.py").write_text(DRIVER)
    return root


class Run:
    """A ``spdflow run`` subprocess whose stderr lines are read as they come."""

    def __init__(self, project: Path, *args: str, **env_extra: str):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", COLUMNS="200", **env_extra)
        env.pop("SPDFLOW_DEBUG", None)
        self.proc = subprocess.Popen([sys.executable, str(project / "driver.py"), "run", *args, "recipe.yaml"],
                                     cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, marker: str, timeout: float = 90.0) -> bool:
        """True once a stderr line contains ``marker``; False if the process ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=deadline - time.monotonic())
            except queue.Empty:
                break
            if line is None:
                return False
            self.seen.append(line)
            if marker in line:
                return True
        raise AssertionError(f"no '{marker}' within {timeout} s: {''.join(self.seen)}")

    def finish(self, timeout: float = 120.0) -> tuple[int, str]:
        code = self.proc.wait(timeout=timeout)
        while True:
            line = self.lines.get(timeout=10)
            if line is None:
                return code, "".join(self.seen)
            self.seen.append(line)


def trusted_artifacts_are_intact(out: Path) -> None:
    """Every export dir is complete by its done marker; nothing else sits beside them but temp dirs."""
    from spdflow_ort.backend import program_is_complete

    export = out / "export"
    if not export.is_dir():
        return
    for entry in export.iterdir():
        if entry.name.endswith(".tmp"):
            continue  # an abandoned temp dir: never read, its name cannot be a cache key
        marker, why = cache.read_done(entry)
        assert marker is not None, f"{entry} is in place but not complete: {why}"
        for qpc in entry.glob("qpc-*"):
            if not qpc.name.endswith(".tmp"):
                assert program_is_complete(qpc), qpc


def outputs(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    return [{"request": r["request"], "tokens": r["tokens"]} for r in rows]


@pytest.fixture(scope="module")
def reference(project) -> list[dict]:
    """The outputs of an uninterrupted run (in-process, its own output dir)."""
    cwd = os.getcwd()
    os.chdir(project)
    try:
        result = CliRunner().invoke(cli, ["run", "-q", "--set", "output=reference", "recipe.yaml"])
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    return outputs(project / "reference")


def test_sigkill_at_random_moments_then_rerun_is_lossless_and_identical(project, reference):
    rng = random.Random(20240607)
    out = project / "out"
    for stage, marker, (low, high) in KILLS:
        run = Run(project, "--check-lossless")
        if run.wait_for(marker):
            time.sleep(rng.uniform(low, high))
        run.proc.send_signal(signal.SIGKILL)
        code, log = run.finish()
        assert code == -signal.SIGKILL or "report: ran" in log, (stage, code, log)
        trusted_artifacts_are_intact(out)
    final = Run(project, "-q", "--check-lossless")
    code, log = final.finish()
    assert code == 0, log
    assert "Traceback" not in log
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "ok"
    assert report["lossless"]["identical"] is True
    assert outputs(out) == reference
    trusted_artifacts_are_intact(out)


def test_a_corrupt_cached_export_is_a_warning_and_a_rebuild(project, reference):
    out = project / "corrupt"
    cwd = os.getcwd()
    os.chdir(project)
    try:
        args = ["run", "-q", "--set", "output=corrupt", "recipe.yaml"]
        assert CliRunner().invoke(cli, args).exit_code == 0
        onnx = next((out / "export").glob("target-*/model.onnx"))
        data = bytearray(onnx.read_bytes())
        data[len(data) // 2] ^= 0xFF
        onnx.write_bytes(bytes(data))
        result = CliRunner().invoke(cli, args)
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    assert "warning:" in result.stderr and "'model.onnx' does not match its recorded hash" in result.stderr
    assert "rebuilding" in result.stderr
    stages = {s["name"]: s for s in json.loads((out / "report.json").read_text())["stages"]}
    assert stages["export"]["status"] == "ran"
    assert outputs(out) == reference
    trusted_artifacts_are_intact(out)


def test_ctrl_c_exits_130_with_an_interrupted_partial_report(project):
    out = project / "sigint"
    run = Run(project, "--set", "output=sigint")
    assert run.wait_for("compile: "), "the run ended before generation"
    time.sleep(0.3)
    run.proc.send_signal(signal.SIGINT)
    code, log = run.finish()
    assert code == 130, log
    assert "interrupted by the user" in log and "Traceback" not in log
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "interrupted"
    stages = {s["name"]: s for s in report["stages"]}
    assert stages["generate"]["status"] == "failed" and stages["generate"]["reason"] == "interrupted"


#: (stage to pause in, signal, exit code); every stage is interrupted once, each signal at least twice
STAGE_SIGNALS = [
    ("export", signal.SIGTERM, 143),
    ("compile", signal.SIGINT, 130),
    ("generate", signal.SIGTERM, 143),
    ("report", signal.SIGINT, 130),
    ("report", signal.SIGTERM, 143),
]


def _previous_report(out: Path) -> None:
    """What a finished earlier run left: a new run must never leave it in place."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps({"status": "ok", "run_id": "previous"}))
    (out / "report.md").write_text("# previous run\n")


@pytest.mark.parametrize("stage,signum,code", STAGE_SIGNALS, ids=[f"{s}-{g.name}" for s, g, _ in STAGE_SIGNALS])
def test_a_signal_in_any_stage_gives_its_exit_code_and_an_interrupted_report(project, stage, signum, code):
    name = f"sig-{stage}-{signum.name}"
    out = project / name
    _previous_report(out)
    run = Run(project, "--set", f"output={name}", SPDFLOW_TEST_PAUSE=stage)
    assert run.wait_for(f"PAUSE {stage}"), f"the run ended before {stage}"
    run.proc.send_signal(signum)
    status, log = run.finish()
    assert status == code, log
    assert "Traceback" not in log
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "interrupted" and report["run_id"] != "previous"
    assert ("terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted by the user") in report["error"]["message"]
    assert "previous run" not in (out / "report.md").read_text()
    trusted_artifacts_are_intact(out)


def test_an_interrupt_that_a_library_swallows_still_stops_the_run(project):
    out = project / "swallowed"
    run = Run(project, "--set", "output=swallowed", SPDFLOW_TEST_PAUSE="export", SPDFLOW_TEST_SWALLOW="1")
    assert run.wait_for("PAUSE export")
    run.proc.send_signal(signal.SIGINT)
    status, log = run.finish()
    assert "SWALLOWED" in log
    assert status == 130, log
    assert json.loads((out / "report.json").read_text())["status"] == "interrupted"


def test_sigint_is_handled_even_when_the_shell_made_the_process_ignore_it(project):
    """A shell starts background jobs with SIGINT ignored; `kill -INT` must still stop a run."""
    out = project / "ignored"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", SPDFLOW_TEST_PAUSE="generate")
    proc = subprocess.Popen([sys.executable, str(project / "driver.py"), "run", "--set", "output=ignored", "recipe.yaml"],
                            cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "PAUSE generate" in line:
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, "".join(seen) + rest
    assert json.loads((out / "report.json").read_text())["status"] == "interrupted"
