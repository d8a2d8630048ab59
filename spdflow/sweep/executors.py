"""Where sweep points run: local processes (the default) or a Ray cluster.

Both start each point as ``python -m spdflow.sweep.worker`` (see :mod:`spdflow.sweep.worker`)
and report back the same outcome, so a sweep gives the same tokens whichever executor ran it.
A point's needs — host CPUs and device ids — bound what runs at once: locally, points never
exceed the cores and never share a device id; on Ray they become task resources (a QAIC point
on 4 device ids asks for 4 ``qaic`` units), so a cluster never oversubscribes a card.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

from spdflow.errors import ExecutorUnavailableError
from spdflow.sweep import worker

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class Needs:
    """What one point holds while it runs."""

    cpus: int | None  # host threads it uses; None: all cores (onnxruntime's default)
    resource: str | None = None  # the backend's device resource, e.g. "qaic"
    device_ids: tuple[int, ...] = ()

    def ray_resources(self) -> dict[str, float]:
        if not self.resource:
            return {}
        return {self.resource: float(len(self.device_ids))}


@dataclass
class Task:
    """One point to run: its payload (point.json) and needs."""

    id: str
    payload: dict
    needs: Needs
    started: float = field(default=0.0)


#: on_start(task) when it starts; on_done(task, outcome) when it ends (outcome: worker.outcome)
OnStart = Callable[[Task], None]
OnDone = Callable[[Task, dict], None]


def make_executor(name: str, *, address: str | None = None, jobs: int | None = None):
    if name == "ray":
        return RayExecutor(address=address, jobs=jobs)
    return LocalExecutor(jobs=jobs)


# ------------------------------------------------------------------------------------ local


class LocalExecutor:
    """Points as local processes: at most ``jobs`` at once (default: the number of cores), their
    CPU needs within the cores, and never two on one device id."""

    name = "local"

    def __init__(self, jobs: int | None = None):
        self.cores = os.cpu_count() or 1
        self.jobs = jobs or self.cores

    def _fits(self, task: Task, running: list[Task]) -> bool:
        if not running:
            return True
        if len(running) >= self.jobs:
            return False
        used = sum(t.needs.cpus or self.cores for t in running)
        if used + (task.needs.cpus or self.cores) > self.cores:
            return False
        held = {(t.needs.resource, d) for t in running if t.needs.resource for d in t.needs.device_ids}
        return not any((task.needs.resource, d) in held for d in task.needs.device_ids)

    def run(self, tasks: list[Task], on_start: OnStart, on_done: OnDone) -> None:
        pending = list(tasks)
        running: dict[object, Task] = {}
        try:
            while pending or running:
                for task in list(pending):
                    if self._fits(task, list(running.values())):
                        pending.remove(task)
                        task.started = time.monotonic()
                        on_start(task)
                        running[worker.launch(task.payload)] = task
                for process in [p for p in running if p.poll() is not None]:
                    task = running.pop(process)
                    on_done(task, worker.outcome(task.payload, process.returncode))
                time.sleep(0.05)
        finally:
            # Ctrl-C, SIGTERM or an error here: every running point writes its interrupted report
            for process, task in list(running.items()):
                on_done(task, worker.outcome(task.payload, worker.stop(process)))


# ------------------------------------------------------------------------------------ ray


RAY_MISSING = ("--executor ray needs Ray, which is not installed here; install it with "
               "`pip install \"spdflow[ray]\"` (or `pip install ray`), or use the local executor")


def import_ray():
    try:
        import ray
    except ImportError:
        raise ExecutorUnavailableError(RAY_MISSING) from None
    return ray


def run_point_task(payload: dict) -> dict:
    """The Ray task: run the point's worker process on this node and return its outcome.

    Cancelling the task (Ctrl-C on the sweep) interrupts the point, which writes its report."""
    process = worker.launch(payload)
    try:
        process.wait()
    except BaseException:
        worker.stop(process)
        raise
    return worker.outcome(payload, process.returncode, files=True)


class RayExecutor:
    """Points as Ray tasks on the cluster at ``address`` (``auto``, ``host:6379``), or on a
    local Ray instance started here (or already started in this process) when no address is
    given. Each task asks for the point's CPUs (``devices.with.threads``, else 1) and one unit of the
    backend's device resource per device id; nodes declare them, e.g.
    ``ray start --resources '{"qaic": 16}'``."""

    name = "ray"

    def __init__(self, address: str | None = None, jobs: int | None = None):
        self.address = address
        self.jobs = jobs
        self.ray = import_ray()

    def _missing(self, task: Task, cluster: dict[str, float]) -> str | None:
        """Why the cluster can never run ``task`` (so it would wait forever), or None."""
        cpus = task.needs.cpus or 1
        if cluster.get("CPU", 0) < cpus:
            return f"it needs {cpus} CPUs but the Ray cluster has {cluster.get('CPU', 0):g}"
        for name, amount in task.needs.ray_resources().items():
            if cluster.get(name, 0) < amount:
                return (f"it needs {amount:g} '{name}' units (device ids {list(task.needs.device_ids)}) but the Ray cluster "
                        f"has {cluster.get(name, 0):g}; start its nodes with `ray start --resources '{{\"{name}\": N}}'`")
        return None

    def run(self, tasks: list[Task], on_start: OnStart, on_done: OnDone) -> None:
        ray = self.ray
        started_here = False
        if not ray.is_initialized():
            import logging

            try:
                ray.init(address=self.address, logging_level=logging.WARNING, log_to_driver=False,
                         configure_logging=True)
            except Exception as exc:
                raise ExecutorUnavailableError(f"cannot start or reach the Ray cluster"
                                               f"{' at ' + self.address if self.address else ''}: {exc}") from exc
            started_here = True
        remote = ray.remote(max_retries=0)(run_point_task)
        cluster = ray.cluster_resources()
        submitted: dict[object, Task] = {}
        queue = list(tasks)
        try:
            while queue or submitted:
                while queue and (self.jobs is None or len(submitted) < self.jobs):
                    task = queue.pop(0)
                    missing = self._missing(task, cluster)
                    if missing:
                        on_done(task, {"exit_code": 1, "log_tail": f"cannot run on this Ray cluster: {missing}",
                                       "report": None, "outputs": None, "host": None})
                        continue
                    task.started = time.monotonic()
                    on_start(task)
                    ref = remote.options(num_cpus=task.needs.cpus or 1, resources=task.needs.ray_resources()).remote(task.payload)
                    submitted[ref] = task
                if not submitted:
                    continue
                done, _ = ray.wait(list(submitted), num_returns=1, timeout=0.5)
                for ref in done:
                    task = submitted.pop(ref)
                    try:
                        result = ray.get(ref)
                    except Exception as exc:  # the task itself died (node lost, worker crash)
                        result = worker.outcome(task.payload, None)
                        result["log_tail"] = f"the Ray task failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    on_done(task, result)
        finally:
            for ref in submitted:
                ray.cancel(ref)  # KeyboardInterrupt in the task: it interrupts its point
            for ref, task in list(submitted.items()):
                try:
                    result = ray.get(ref, timeout=30)
                except Exception:
                    result = worker.outcome(task.payload, 130)
                on_done(task, result)
            if started_here:
                ray.shutdown()
