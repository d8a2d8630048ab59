"""Library entry points behind ``spdflow run``: run a recipe, or describe its plan."""
from __future__ import annotations

import json

from spdflow.engine.run import Engine, RunOptions
from spdflow.recipe.loader import LoadedRecipe


def run_recipe(pm, loaded: LoadedRecipe, options: RunOptions, *, quiet: bool = False, summary: bool = True) -> dict:
    """Run every stage of the recipe; returns report.json's content. Progress goes to stderr;
    the summary table (unless ``quiet`` or not ``summary``) to stdout. Raises SpdflowError on
    failure after writing the partial report (its path is in the message's hint)."""
    from spdflow.ui import RichUI

    ui = RichUI(quiet=quiet)
    engine = Engine(pm, loaded, options, ui)
    try:
        engine.run()
    except Exception as exc:
        if hasattr(exc, "hint") and getattr(exc, "hint", None) is None and (engine.run_dir / "report.json").exists():
            import shlex

            again = shlex.join(["spdflow", "run", str(loaded.path), *(w for o in loaded.overrides for w in ("--set", o))])
            stage = _resume_stage(engine)
            exc.hint = f"partial report: {engine.run_dir / 'report.json'}; resume with `{again}" + \
                       (f" --from {stage}`" if stage else "`")
        raise
    report = json.loads((engine.run_dir / "report.json").read_text())
    if summary and not quiet:
        _print_summary(engine, report)
    return report


def _resume_stage(engine) -> str | None:
    for name, stage in engine.state.stages.items():
        base = name.split(":")[0]  # a draft's compile:draft resumes from compile
        if stage.status == "failed" and base in ("export", "specialize", "compile", "generate"):
            return base
    return None


def _print_summary(engine, report: dict) -> None:
    """The summary table and the report's path: results, so on stdout."""
    from rich.console import Console

    from spdflow.report.model import RunReport
    from spdflow.report.render import summary_table

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(width=160, highlight=False)  # piped: keep rows on one line each where possible
    console.print(summary_table(RunReport.model_validate(report)))
    console.print(f"report: {engine.run_dir / 'report.md'}")


def dry_run_plan(pm, loaded: LoadedRecipe, options: RunOptions) -> tuple[str, list]:
    """The plan as text (stages; for every program, the target's and each auxiliary model's:
    specializations, program dir and exact compile command) and the
    preflight findings that would stop the run (the backend's absence only noted); runs nothing."""
    from spdflow.plugins import resolve_acceptance
    from spdflow.preflight import preflight

    findings = preflight(loaded, pm)
    recipe = loaded.recipe
    engine = Engine(pm, loaded, options)
    backend = engine.backend()
    programs = engine.programs()
    lines = [f"recipe: {loaded.path} (name '{recipe.name}')",
             f"output: {recipe.output_dir()}",
             f"model: {recipe.model.id} ({recipe.model.dtype})",
             f"proposer: {recipe.proposer.uses if recipe.proposer else 'none (no-spec)'}; "
             f"K-list {recipe.k_list()}; k_policy {recipe.k_policy.uses}; acceptance {resolve_acceptance(pm, recipe)}",
             "stages: export -> specialize -> compile -> generate -> report"
             + ("" if len(programs) == 1 else " (export, specialize and compile once per program)")
             + (" (generate skipped: --compile-only)" if options.compile_only else ""),
             f"backend: {recipe.devices.backend}"]
    for plan in programs:
        lines += engine.describe_program(plan)
    reason = backend.unavailable_reason()
    if reason:
        lines.append(f"note: backend '{recipe.devices.backend}' cannot run here: {reason}")
    shown = [f for f in findings if f.code != "SPD104"]
    errors = [f for f in shown if f.severity == "error"]
    lines.append("preflight: " + ("everything checkable before export is fine" if not shown else
                                  f"{len(errors)} error(s) (on stderr), {len(shown) - len(errors)} warning(s) or note(s)"))
    for f in shown:
        if f.severity == "error":
            continue
        label = {"error": "", "warning": "warning: ", "info": "note: "}.get(f.severity, "")
        lines.append(f"  {f.location.render()}: {f.code} {label}{f.message}")
    return "\n".join(lines), errors
