"""The ``spdflow sweep`` command: parse, call :func:`spdflow.sweep.run.run_sweep`, render.

The point table goes to stdout, progress to stderr. Exit codes: 0 every point ok, 1 a point
failed (or the executor cannot run here, e.g. Ray not installed), 2 usage, 3 invalid sweep
file or point, 130 interrupted (rerun to finish the missing points).
"""
from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command()
@click.argument("sweep_file", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: processes on this machine, bounded by its cores; ray: tasks on a Ray cluster (pip install \"spdflow[ray]\").")
@click.option("--address", metavar="ADDR", help="Ray cluster address (e.g. auto or host:6379); default: start a local Ray instance.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="At most this many points at once (local default: the number of cores).")
@click.option("--rerun", is_flag=True, help="Run finished points again too (default: skip them, saying why).")
@click.option("--dry-run", is_flag=True, help="Validate and lint every point, list them; run nothing.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@click.option("--json", "as_json", is_flag=True, help="Print sweep.json on stdout instead of the table.")
def sweep(sweep_file, executor, address, jobs, rerun, dry_run, quiet, as_json):
    """Run every point of the sweep FILE: a base recipe times a matrix of recipe keys.

    Points share exports and compiled programs (cache/ in the output dir); a rerun skips
    finished points. Writes sweep.json, sweep.md and sweep.html in the output dir.
    """
    from spdflow.cli import _pm
    from spdflow.errors import UsageError
    from spdflow.sweep.run import SweepOptions, dry_run_text, load_sweep, run_sweep

    if address and executor != "ray":
        raise UsageError("--address is for --executor ray", hint="add --executor ray, or drop --address")
    pm = _pm()
    loaded = load_sweep(sweep_file, pm)
    for finding in loaded.findings:  # warnings only: errors raised above
        click.echo(finding.render().replace(f" {finding.code} ", f" {finding.code} warning: ", 1), err=True)
    if dry_run:
        click.echo(dry_run_text(loaded))
        return
    result = run_sweep(pm, loaded, SweepOptions(executor=executor, address=address, jobs=jobs, rerun=rerun), quiet=quiet)
    if as_json:
        click.echo(result.model_dump_json(indent=2))
    else:
        _print_table(result, loaded.output_dir())
    if result.status != "ok":
        failed = [p.id for p in result.points if p.status != "ok"]
        click.echo(f"Error: {len(failed)} of {len(result.points)} points did not finish: {', '.join(failed)}", err=True)
        click.echo(f"Hint: see points/<id>/run.log in {loaded.output_dir()}; rerun `spdflow sweep {sweep_file}` "
                   "to run only those points", err=True)
        sys.exit(1)


def _print_table(result, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from spdflow.sweep.report import table_rows

    header, rows = table_rows(result)
    keep = [i for i, name in enumerate(header) if name in ("point", "status", "decode tok/s", "AL", "TPOT ms", "lossless", "note")]
    table = Table(*[header[i] for i in keep], title=f"sweep {result.name} · {result.status}", title_justify="left")
    for row in rows:
        table.add_row(*[row[i] for i in keep])
    console = Console(width=max(120, Console().width))
    console.print(table)
    console.print(f"report: {out / 'sweep.md'}")

