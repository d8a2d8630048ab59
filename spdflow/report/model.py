"""The run report: ``report.json``'s versioned schema (``report_version: 1``).

The engine builds a :class:`RunReport` at the end of every run (ok, failed or interrupted);
``spdflow.report.render`` writes it as JSON, Markdown and HTML; :func:`load_report` reads it
back. Fields may be added within version 1, never removed or changed in meaning.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import resource
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from spdflow.errors import SpdflowError
from spdflow.files import sha256_file
from spdflow.report.metrics import Metrics, StepCost

REPORT_VERSION = 1

#: Packages whose versions the environment records. Read with importlib.metadata, so none
#: of them is imported (torch alone takes seconds).
ENVIRONMENT_PACKAGES = ("spdflow", "numpy", "pydantic", "onnx", "onnxruntime", "torch", "transformers", "tokenizers")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PluginRecord(_Model):
    """One loaded plugin."""

    name: str = Field(description="Entry-point (or in-process) plugin name.")
    distribution: str | None = Field(None, description="The installed distribution that ships it.")
    version: str | None = Field(None, description="That distribution's version.")


class Environment(_Model):
    """Where the run happened."""

    python: str = Field(description="Python version, e.g. 3.11.7.")
    platform: str = Field(description="platform.platform().")
    machine: str = Field(description="platform.machine(), e.g. x86_64.")
    cpu_count: int | None = Field(description="Logical CPUs (os.cpu_count()).")
    packages: dict[str, str | None] = Field(
        description="Installed versions of the relevant packages; null when not installed."
    )


class StageRecord(_Model):
    """What one stage did."""

    name: str = Field(description="export, specialize, compile, generate, report (or a plugin's stage).")
    status: Literal["ran", "cached", "skipped", "failed", "not_run"] = Field(
        description="ran; cached (cache key unchanged, output reused); skipped (not needed, e.g. "
        "--compile-only generation); failed; not_run (an earlier stage failed or the run stopped)."
    )
    reason: str = Field("", description="Why it ran, was cached or skipped, in a few words.")
    duration_s: float | None = Field(None, description="Wall time of the stage (s).")
    cache_key: str | None = Field(None, description="Content hash that decides whether the stage reruns.")
    detail: dict[str, Any] = Field(default_factory=dict, description="Stage-specific facts (paths, counts).")


class Artifact(_Model):
    """One file the run produced."""

    name: str = Field(description="What the file is, e.g. target.onnx, trace.")
    path: str = Field(description="Path relative to the run directory, POSIX form; absolute when the file "
                      "lives outside it (a shared cache dir).")
    sha256: str | None = Field(None, description="Hex SHA-256 of the file content.")
    bytes: int | None = Field(None, description="File size in bytes.")


class Lossless(_Model):
    """Whether speculative output matched the no-spec baseline token for token."""

    checked: bool = Field(description="True when a baseline was available and compared.")
    identical: bool | None = Field(None, description="True when every request's tokens matched; null when not checked.")
    mismatched_requests: list[int] = Field(default_factory=list, description="Indices of requests whose tokens differ.")
    baseline: str = Field("", description="What the output was compared with, or why it was not.")


class Baseline(_Model):
    """The no-spec baseline measured in the same process as this run (``--baseline``,
    ``--check-lossless``): same compiled program, same session, same requests, run first."""

    decode_tokens_per_s: float | None = Field(None, description="The baseline's decode throughput (tokens/s).")
    e2e_tokens_per_s: float | None = Field(None, description="The baseline's end-to-end throughput (tokens/s).")
    tpot_median_s: float | None = Field(None, description="The baseline's median time per output token (s).")
    ttft_median_s: float | None = Field(None, description="The baseline's median time to first token (s).")
    wall_s: float | None = Field(None, description="The baseline's generation wall time (s).")
    generated_tokens: int | None = Field(None, description="Tokens the baseline generated.")
    decode_steps: int | None = Field(None, description="Decode steps the baseline ran.")
    step_costs: list[StepCost] = Field(default_factory=list, description="The baseline's verify time per (K=0, batch).")


class TimedCosts(_Model):
    """Every compiled K timed at one batch size after generation (``cost_grid.json``)."""

    batch: int = Field(description="Rows of the timed shapes.")
    verify_s: dict[int, float] = Field(description="K -> median seconds of a verify run repeated at that K.")
    switch_s: float | None = Field(None, description="Extra seconds of the first run after a change of K.")


class OracleSection(_Model):
    """The oracle of a greedy run with a proposer (``spdflow.oracle``): the fastest K schedule
    knowing what every K would accept at every step, the run's policy and the static choices,
    all priced by the run's own measured step costs, computed after generation."""

    computed: bool = Field(description="False when there is no oracle for this run (see reason).")
    reason: str = Field("", description="Why it was not computed (sampled run, no proposer, cost unavailable, ...).")
    label: str | None = Field(None, description="'oracle', or 'oracle (best found, beam W)' when the search did not "
                              "prove it best (a lower bound on the best possible speed).")
    exact: bool | None = Field(None, description="True when the schedule is proven the fastest.")
    beam_width: int | None = Field(None, description="States the search keeps per step beyond which it is a beam.")
    batch_size: int | None = Field(None, description="Rows per step (the run's).")
    oracle_tokens_per_s: float | None = Field(None, description="The oracle's tokens/s, priced, prefill included.")
    oracle_steps: int | None = Field(None, description="Decode steps of the oracle schedule.")
    oracle_k_usage: dict[int, int] = Field(default_factory=dict, description="K -> oracle steps at that K.")
    policy_priced_tokens_per_s: float | None = Field(None, description="This run's own steps priced alike.")
    policy_efficiency: float | None = Field(None, description="policy_priced_tokens_per_s ÷ oracle_tokens_per_s.")
    regret_vs_best_static: float | None = Field(None, description="policy ÷ max(no-spec, best fixed K), priced, − 1.")
    best_static: str | None = Field(None, description="The fastest static choice, priced: 'no-spec' or 'fixed K=k'.")
    best_static_tokens_per_s: float | None = Field(None, description="Its priced tokens/s.")
    nospec_priced_tokens_per_s: float | None = Field(None, description="K = 0 every step, priced (null: K = 0 not "
                                                     "compiled).")
    fixed_priced_tokens_per_s: dict[int, float] = Field(default_factory=dict, description="K -> K every step, priced.")
    cost: dict[str, Any] = Field(default_factory=dict, description="The step costs used and where each comes from.")
    seconds: float | None = Field(None, description="What computing it took, after generation (not in the run's "
                                  "tokens/s).")


class ErrorRecord(_Model):
    """Why a run failed or stopped."""

    stage: str | None = Field(None, description="The stage that failed, if any.")
    message: str = Field(description="The one-sentence error shown to the user.")


class RunReport(_Model):
    """Everything ``report.json`` holds about one run."""

    report_version: Literal[1] = Field(REPORT_VERSION, description="Schema version of this file.")
    run_id: str = Field(description="Unique id of the run (name + start time).")
    status: Literal["ok", "failed", "interrupted"] = Field(description="How the run ended.")
    recipe: dict[str, Any] = Field(default_factory=dict, description="The validated recipe, as a plain mapping.")
    recipe_path: str | None = Field(None, description="The recipe file the run was started from.")
    recipe_sha256: str | None = Field(None, description="Hex SHA-256 of the recipe file's bytes.")
    overrides: list[str] = Field(default_factory=list, description="The --set overrides applied to the file, in order.")
    recipe_effective_sha256: str | None = Field(
        None, description="Hex SHA-256 of the effective recipe (defaults filled, --set applied) as canonical JSON: "
        "two runs with the same value ran the same recipe."
    )
    spdflow_version: str = Field(description="spdflow version that wrote the report.")
    plugins: list[PluginRecord] = Field(default_factory=list, description="Plugins loaded for the run.")
    environment: Environment | None = Field(None, description="Python, platform and package versions.")
    stages: list[StageRecord] = Field(default_factory=list, description="Stages in run order.")
    artifacts: list[Artifact] = Field(default_factory=list, description="Files the run produced.")
    metrics: Metrics | None = Field(None, description="Generation metrics; null when generation did not run.")
    lossless: Lossless | None = Field(None, description="Comparison with the no-spec baseline, when done.")
    baseline: Baseline | None = Field(None, description="No-spec speed measured in this process, when it ran.")
    timed_costs: list[TimedCosts] = Field(
        default_factory=list, description="Every compiled K timed after generation (from cost_grid.json), per batch."
    )
    oracle: OracleSection | None = Field(None, description="The oracle and the policy's efficiency and regret, for a "
                                         "finished generation (computed, or why not).")
    peak_rss_mb: float | None = Field(None, description="Peak resident memory of the run process (MiB).")
    error: ErrorRecord | None = Field(None, description="Set when status is failed or interrupted.")
    started_at: str = Field(description="Start time, ISO 8601 with time zone.")
    duration_s: float | None = Field(None, description="Wall time of the whole run (s).")
    paths: dict[str, str] = Field(default_factory=dict, description="Named paths: run_dir, trace, report files.")

    @model_validator(mode="after")
    def _share_engine_facts_with_metrics(self) -> "RunReport":
        # Metrics also carries peak RSS and the lossless verdict (so a metrics table alone is
        # complete); keep the two copies in step whichever side the engine filled.
        if self.metrics is None:
            return self
        if self.peak_rss_mb is None:
            self.peak_rss_mb = self.metrics.peak_rss_mb
        elif self.metrics.peak_rss_mb is None:
            self.metrics.peak_rss_mb = self.peak_rss_mb
        if self.metrics.lossless is None and self.lossless is not None and self.lossless.checked:
            self.metrics.lossless = self.lossless.identical
        return self


# ------------------------------------------------------------------------------------------
# builders the engine uses


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or None; never imports it."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def collect_environment(packages: tuple[str, ...] = ENVIRONMENT_PACKAGES) -> Environment:
    """The :class:`Environment` of this process."""
    return Environment(
        python=platform.python_version(),
        platform=platform.platform(),
        machine=platform.machine(),
        cpu_count=os.cpu_count(),
        packages={name: package_version(name) for name in packages},
    )


def peak_rss_mb() -> float:
    """The process's high-water resident set (MiB)."""
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(usage / 1024 if sys.platform != "darwin" else usage / (1024 * 1024), 1)


def make_artifact(run_dir: Path, path: Path, name: str | None = None, *, hash_file: bool = True) -> Artifact:
    """An :class:`Artifact` for ``path`` (inside ``run_dir``) with its size and hash."""
    path = Path(path)
    try:
        relative = path.resolve().relative_to(Path(run_dir).resolve()).as_posix()
    except ValueError:  # outside the run dir: a shared cache (spdflow sweep, --cache-dir)
        relative = path.resolve().as_posix()
    return Artifact(
        name=name or path.name,
        path=relative,
        sha256=sha256_file(path) if hash_file else None,
        bytes=path.stat().st_size,
    )


def load_report(path: Path) -> RunReport:
    """Read a ``report.json`` (or a run directory holding one).

    Raises :class:`spdflow.errors.SpdflowError` with one sentence when the file is missing,
    is not JSON, or does not match the schema.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpdflowError(f"cannot read the run report {path}: {exc.strerror}", hint="run `spdflow run` first") from exc
    try:
        return RunReport.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise SpdflowError(
            f"{path} is not a valid spdflow run report: {where}: {first['msg']}",
            hint="it may come from a newer spdflow; rerun the recipe to rewrite it",
        ) from exc
