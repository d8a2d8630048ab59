"""The ``spdflow bench`` command: parse, call :func:`spdflow.bench.bench_recipe`, render.

The table goes to stdout, progress to stderr; ``--json PATH`` also writes the rows.
"""
from __future__ import annotations

from pathlib import Path

import click

from spdflow.errors import UsageError


def parse_list(text: str | None, what: str, cast=str) -> list | None:
    """'1,2,4' -> [1, 2, 4]; None stays None; a bad item is a usage error naming ``what``."""
    if text is None:
        return None
    items = [item.strip() for item in text.split(",") if item.strip()]
    try:
        return [cast(item) for item in items]
    except ValueError:
        raise UsageError(f"--{what} must be a comma-separated list, got '{text}'") from None


@click.command()
@click.argument("recipe", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--batch-sizes", help="Comma-separated batch sizes, e.g. 1,2,4,8 (default: the recipe's).")
@click.option("--modes", default="nospec,fixed,varK,smallest_covering", show_default=True,
              help="Comma-separated modes: nospec, fixed (largest K), fixed:<K> (any K > 0 of the recipe's "
                   "K-list), fixed:all (fixed:<K> for each of them), varK (the recipe's K policy), or any K policy's "
                   "name (smallest_covering, goodput, ...); K-list rows are named varK:<policy>.")
@click.option("--peers", default="", help="Comma-separated peers to run too, interleaved with the modes, each in its own child process: "
              "hf (transformers), ort-genai (onnxruntime-genai), llama.cpp (llama-cpp-python); one not installed "
              "is skipped with a line.")
@click.option("--repeats", default=3, show_default=True, type=int, help="Timed runs per mode (interleaved).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the rows as JSON here.")
@click.option("--markdown", is_flag=True, help="Print a markdown table instead of the rich one.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe key (dotted path; value parsed as YAML). Repeatable.")
@click.option("--no-oracle", "no_oracle", is_flag=True,
              help="Skip the oracle columns (oracle tok/s, policy efficiency, regret) of K-list policy rows; computing "
                   "them re-runs the proposer once per request and K after the timed runs (costly for a draft model).")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@click.option("--allow-outside-paths", is_flag=True, help="Let the recipe read files outside its own folder.")
def bench(recipe, batch_sizes, modes, peers, repeats, json_path, markdown, overrides, no_oracle, quiet,
          allow_outside_paths):
    """Benchmark RECIPE: no-spec vs fixed-K vs each K policy (and peers) on one workload, side by side.

    Compiles once per batch size (the K-list plus 0) and reuses one session across modes;
    modes and repeats are interleaved; every figure (AL and K histogram too) is a median over repeats.
    Greedy K-list policy rows also get the oracle (the best K schedule in hindsight, * when a beam's
    best found), the policy's efficiency against it and its regret against the best static choice,
    all priced by the step costs the runs measured.
    """
    from rich.console import Console

    from spdflow.bench import BenchOptions, bench_recipe, markdown_table, rich_table
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe
    from spdflow.ui import RichUI

    options = BenchOptions(batch_sizes=parse_list(batch_sizes, "batch-sizes", int), modes=parse_list(modes, "modes"),
                           peers=parse_list(peers, "peers") or [], repeats=repeats, json_path=json_path,
                           oracle=not no_oracle)
    pm = get_plugin_manager()
    loaded = load_recipe(recipe, pm, list(overrides))
    loaded.allow_outside_paths = allow_outside_paths
    rows = bench_recipe(pm, loaded, options, RichUI(quiet=quiet))
    if markdown:
        click.echo(markdown_table(rows))
    else:
        console = Console()
        if not console.is_terminal:
            console = Console(width=200)  # piped: keep whole rows on one line
        console.print(rich_table(rows, title=f"spdflow bench {loaded.recipe.name}"))
