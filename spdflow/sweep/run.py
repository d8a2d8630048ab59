"""Running a sweep: expand the points, skip the finished ones, run the rest, write the report.

Layout of the sweep's output dir::

    <output>/sweep.json, sweep.md, sweep.html, plots/*.png
    <output>/cache/export/...      exports and compiled programs, shared by every point
                                   (the sweep's ``cache`` key may name another dir)
    <output>/points/<id>/          each point's own run dir (recipe.yaml, point.json, run.log,
                                   report.json, outputs.jsonl, trace.jsonl, ...)

A point is finished when its report.json says ``ok`` and its point.json has the point's key;
a rerun skips it and says so. A failed or interrupted point is run again. Points share exports
and programs through the cache, whose entries are built under a lock and renamed into place,
so two points needing the same export build it once and a killed point leaves nothing
half-written behind.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from spdflow.engine.cache import build_lock
from spdflow.errors import RecipeError, SpdflowError
from spdflow.sweep.executors import Needs, Task, make_executor
from spdflow.sweep.report import PointResult, SweepReport, point_result, write_sweep_json, write_sweep_report
from spdflow.sweep.spec import LoadedSweep, SweepPoint, read_sweep
from spdflow.sweep.worker import POINT_FILE


@dataclass
class SweepOptions:
    executor: str = "local"
    address: str | None = None
    jobs: int | None = None
    rerun: bool = False  # run finished points again too


def load_sweep(path: Path | str, pm) -> LoadedSweep:
    """Read a sweep file; any error (in the file or in an expanded point) raises one RecipeError."""
    loaded = read_sweep(path, pm)
    errors = loaded.errors
    if errors:
        count = f"{len(errors)} error{'s' if len(errors) > 1 else ''}"
        raise RecipeError(f"sweep '{path}' is invalid: {count}", findings=errors,
                          hint="`spdflow lint` shows every finding with its line")
    return loaded


def point_needs(point: SweepPoint, pm) -> Needs:
    """Host threads (the backend's ``devices.with.threads``) and device ids the point holds while it runs."""
    recipe = point.loaded.recipe
    threads = getattr(point.loaded.backend_config, "threads", None)
    registration = pm.registry()["backend"].get(recipe.devices.backend)
    resource = getattr(registration.factory, "device_resource", None) if registration else None
    return Needs(cpus=threads, resource=resource, device_ids=tuple(recipe.devices.device_ids) if resource else ())


def payload_for(loaded: LoadedSweep, point: SweepPoint) -> dict:
    out = loaded.output_dir().resolve()
    point_dir = out / "points" / point.id
    return {"sweep_version": 1, "sweep": loaded.spec.name, "id": point.id, "key": point.key, "label": point.label(),
            "dir": str(point_dir), "recipe_file": str(point_dir / "recipe.yaml"), "root": str(loaded.base_root),
            "cache_dir": str(loaded.spec.cache_dir().resolve()), "check_lossless": loaded.spec.check_lossless, "cwd": os.getcwd(),
            "recipe": point.recipe}


def finished_earlier(point_dir: Path, key: str) -> str | None:
    """Why the point needs no rerun (its report says ok for this very point), or None."""
    try:
        recorded = json.loads((point_dir / POINT_FILE).read_text(encoding="utf-8")).get("key")
        report = json.loads((point_dir / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, AttributeError):
        return None
    if recorded != key or report.get("status") != "ok":
        return None
    return f"finished earlier (report.json ok, key {key[:8]}); --rerun runs it again"


def dry_run_text(loaded: LoadedSweep) -> str:
    """The points a sweep would run, one line each, and where they would go."""
    out = loaded.output_dir()
    lines = [f"sweep: {loaded.path} (name '{loaded.spec.name}'), {len(loaded.points)} points",
             f"output: {out} (points/<id>/); shared cache: {loaded.spec.cache_dir()}"]
    width = max((len(p.id) for p in loaded.points), default=0)
    for point in loaded.points:
        done = finished_earlier(out.resolve() / "points" / point.id, point.key)
        lines.append(f"  {point.id:{width}}  {point.label()}" + ("  [finished earlier]" if done else ""))
    return "\n".join(lines)


class _Progress:
    """One line per point on stderr (quiet: nothing)."""

    def __init__(self, quiet: bool):
        self.quiet, self.done = quiet, 0

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)


def run_sweep(pm, loaded: LoadedSweep, options: SweepOptions, *, quiet: bool = False) -> SweepReport:
    """Run every unfinished point of the sweep with the chosen executor; write sweep.json/.md/.html.

    Raises RunInterrupted (after writing the report) on Ctrl-C or SIGTERM."""
    executor = make_executor(options.executor, address=options.address, jobs=options.jobs)
    out = loaded.output_dir().resolve()
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(build_lock(out, wait=False))
        except BlockingIOError:
            raise SpdflowError(f"another spdflow sweep is running in {out}",
                               hint="wait for it to finish, or give this sweep another output dir") from None
        return _run_points(pm, loaded, executor, out, options, quiet)


def _run_points(pm, loaded: LoadedSweep, executor, out: Path, options: SweepOptions, quiet: bool) -> SweepReport:
    from spdflow.errors import RunInterrupted

    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    results: dict[str, PointResult] = {}
    tasks: list[Task] = []
    progress = _Progress(quiet)
    for point in loaded.points:
        point_dir = out / "points" / point.id
        reason = None if options.rerun else finished_earlier(point_dir, point.key)
        if reason:
            results[point.id] = point_result(point, point_dir, "earlier", reason=reason)
            progress.say(f"{point.id}: skipped — {reason}")
        else:
            results[point.id] = point_result(point, point_dir, "no", reason="not run yet")
            tasks.append(Task(point.id, payload_for(loaded, point), point_needs(point, pm)))
    by_id = {p.id: p for p in loaded.points}

    def snapshot(status: str) -> SweepReport:
        return SweepReport(name=loaded.spec.name, sweep_file=str(loaded.path), executor=executor.name,
                           started_at=started_at, duration_s=round(time.monotonic() - t0, 3), status=status,
                           points=[results[p.id] for p in loaded.points])

    def report(status: str) -> SweepReport:
        sweep = snapshot(status)
        write_sweep_report(out, sweep)
        return sweep

    def on_start(task: Task) -> None:
        results[task.id].reason = "running"
        progress.say(f"{task.id}: started ({by_id[task.id].label()})")

    def on_done(task: Task, outcome: dict) -> None:
        point_dir = Path(task.payload["dir"])
        _keep_remote_report(point_dir, outcome)
        result = point_result(by_id[task.id], point_dir, "now", outcome=outcome,
                              duration_s=round(time.monotonic() - task.started, 3) if task.started else None)
        results[task.id] = result
        progress.done += 1
        progress.say(f"{task.id}: {result.status}" + (f" — {result.reason}" if result.status != "ok" else "")
                     + f" [{progress.done}/{len(tasks)}]")
        write_sweep_json(out, snapshot("running"))  # a current sweep.json while the sweep runs

    previous = _sigterm_as_interrupt()
    try:
        executor.run(tasks, on_start, on_done)
    except KeyboardInterrupt:
        report("interrupted")
        raise RunInterrupted(f"sweep interrupted; finished points are kept in {out / 'points'}",
                             hint=f"rerun `spdflow sweep {loaded.path}` to run only the missing points") from None
    except SpdflowError:
        report("failed")
        raise
    finally:
        _restore_sigterm(previous)
    failed = [r for r in results.values() if r.status != "ok"]
    return report("failed" if failed else "ok")


def _keep_remote_report(point_dir: Path, outcome: dict) -> None:
    """A point that ran on another Ray node: keep its report.json and outputs here too."""
    from spdflow.files import write_text_atomic

    for name, key in (("report.json", "report"), ("outputs.jsonl", "outputs")):
        if outcome.get(key) and not (point_dir / name).is_file():
            point_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(point_dir / name, outcome[key])


def _sigterm_as_interrupt():
    """SIGTERM stops a sweep like Ctrl-C: running points write their reports, then the sweep's."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        return None


def _restore_sigterm(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
