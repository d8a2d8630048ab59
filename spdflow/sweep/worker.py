"""Run one sweep point in its own process: ``python -m spdflow.sweep.worker POINT_JSON``.

Each point runs in a fresh process whichever executor started it (a local subprocess or a Ray
task), so a crash, a kill or a leaked thread pool of one point never touches another, and every
point measures with the same process state. The point file (written by the sweep) holds the
expanded recipe, the folder its relative paths resolve against, and the shared cache dir.
Exit codes are those of ``spdflow run``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

POINT_FILE = "point.json"
LOG_FILE = "run.log"


def write_point_files(payload: dict) -> Path:
    """Write point.json and the point's recipe.yaml into its dir (again on another Ray node)."""
    import yaml

    from spdflow.files import write_json_atomic, write_text_atomic

    point_dir = Path(payload["dir"])
    point_dir.mkdir(parents=True, exist_ok=True)
    header = (f"# Point {payload['id']} of sweep '{payload['sweep']}' ({payload['label']}), written by spdflow sweep.\n"
              f"# Relative paths resolve against {payload['root']}.\n")
    write_text_atomic(point_dir / "recipe.yaml", header + yaml.safe_dump(payload["recipe"], sort_keys=False))
    write_json_atomic(point_dir / POINT_FILE, payload)
    return point_dir / POINT_FILE


def launch(payload: dict) -> subprocess.Popen:
    """Start the worker process of one point, its output in the point's run.log."""
    point_file = write_point_files(payload)
    # a stale report must never pass for this run's
    (Path(payload["dir"]) / "report.json").unlink(missing_ok=True)
    log = open(Path(payload["dir"]) / LOG_FILE, "w", encoding="utf-8")
    cwd = payload.get("cwd")
    from spdflow.cli import verbose_requested

    # `spdflow -v sweep`: each point's run.log gets its traceback too
    env = dict(os.environ, SPDFLOW_DEBUG="1") if verbose_requested() else None
    try:
        return subprocess.Popen([sys.executable, "-m", "spdflow.sweep.worker", str(point_file)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=cwd if cwd and os.path.isdir(cwd) else None, preexec_fn=_die_with_parent,
                                # its own process group: a terminal's Ctrl-C reaches only the sweep,
                                # which passes exactly one SIGINT on (a second would cut the report)
                                start_new_session=True)
    finally:
        log.close()


def _die_with_parent() -> None:
    """Linux: the point gets SIGTERM (and writes its partial report) if the sweep is killed."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def stop(process: subprocess.Popen, grace_s: float = 20.0) -> int | None:
    """Interrupt a running point (SIGINT: it writes an 'interrupted' report), then kill it."""
    if process.poll() is None:
        try:
            process.send_signal(signal.SIGINT)
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        except ProcessLookupError:
            pass
    return process.returncode


def outcome(payload: dict, exit_code: int | None, *, files: bool = False) -> dict:
    """What an executor returns for a point: exit code, last error line, host, and with
    ``files`` the text of report.json and outputs.jsonl (a Ray task on another node)."""
    import socket

    point_dir = Path(payload["dir"])
    report = point_dir / "report.json"
    outputs = point_dir / "outputs.jsonl"
    log_tail = ""
    try:
        lines = (point_dir / LOG_FILE).read_text(encoding="utf-8", errors="replace").strip().splitlines()
        errors = [line for line in lines if line.startswith("Error: ")]
        log_tail = (errors[-1][len("Error: "):] if errors else (lines[-1] if lines else ""))[:500]
    except OSError:
        pass
    result = {"exit_code": exit_code, "host": socket.gethostname(), "log_tail": log_tail, "report": None, "outputs": None}
    if files:
        result["report"] = report.read_text(encoding="utf-8") if report.is_file() else None
        result["outputs"] = outputs.read_text(encoding="utf-8") if outputs.is_file() else None
    return result


def run_point(point_file: Path) -> int:
    """Load the point's recipe and run it with the sweep's shared cache; returns the exit code."""
    from spdflow.cli import internal_error, report_error
    from spdflow.engine.run import RunOptions
    from spdflow.errors import SpdflowError
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe
    from spdflow.runner import run_recipe

    def terminate(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    try:
        payload = json.loads(Path(point_file).read_text(encoding="utf-8"))
        pm = get_plugin_manager()
        loaded = load_recipe(payload["recipe_file"], pm, root=Path(payload["root"]))
        options = RunOptions(cache_dir=Path(payload["cache_dir"]), check_lossless=payload["check_lossless"])
        run_recipe(pm, loaded, options, quiet=True)
    except SpdflowError as exc:
        report_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: one sentence, like the CLI
        report_error(internal_error(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_point(Path(sys.argv[1])))
