"""The ``spdflow`` command: thin commands that parse, call one library function, and render.

Results go to stdout; progress, warnings and errors to stderr.

Exit codes: 0 ok · 1 run failure or lint findings · 2 usage · 3 invalid recipe ·
4 plugin fault · 5 lossless check failed · 130 interrupted · 143 terminated.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import click

from spdflow import __version__
from spdflow.errors import RunInterrupted, RunTerminated, SpdflowError

#: where the group's --verbose flag is kept for the commands and the error handler (click context meta)
VERBOSE_KEY = "spdflow.verbose"


def verbose_requested() -> bool:
    """--verbose given (anywhere on the line) or SPDFLOW_DEBUG=1 in the environment; read, never set."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.find_root().meta.get(VERBOSE_KEY):
        return True
    return os.environ.get("SPDFLOW_DEBUG") == "1"


def report_error(exc: SpdflowError) -> None:
    """One sentence (plus located findings and a hint) on stderr."""
    for finding in getattr(exc, "findings", None) or []:
        click.echo(finding.render(), err=True)
    click.echo(f"Error: {exc.message}", err=True)
    if exc.hint:
        click.echo(f"Hint: {exc.hint}", err=True)
    if verbose_requested():
        click.echo("".join(traceback.format_exception(exc)), err=True)
    elif exc.__cause__ is not None and not isinstance(exc.__cause__, SpdflowError):
        click.echo("(re-run with --verbose for the traceback)", err=True)


#: Options whose next word is their value, so a "-v" right after them is not the verbose flag.
_TAKES_VALUE = {"--set", "--from", "--report", "--format", "--output", "-o", "--exclude", "--select", "--ignore",
                "--recipe-glob", "--batch-sizes", "--modes", "--peers", "--repeats"}


def hoist_verbose(args: list[str]) -> list[str]:
    """``-v``/``--verbose`` anywhere on the command line (``spdflow run r.yaml -v``) moves to the
    front, where the group option lives; words after ``--`` and option values stay put."""
    front, rest = [], []
    for i, word in enumerate(args):
        if word == "--":
            rest += args[i:]
            break
        if word in ("-v", "--verbose") and not (i and args[i - 1] in _TAKES_VALUE):
            front.append(word)
        else:
            rest.append(word)
    return front[:1] + rest


class SpdflowGroup(click.Group):
    """Turns SpdflowError into one sentence and its exit code, in one place."""

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, hoist_verbose(list(args)))

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SpdflowError as exc:
            report_error(exc)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt as exc:
            from spdflow.engine.signals import Terminated

            click.echo("Terminated." if isinstance(exc, Terminated) else "Interrupted.", err=True)
            ctx.exit(RunTerminated.exit_code if isinstance(exc, Terminated) else RunInterrupted.exit_code)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:  # a bug: still one sentence, the traceback only with --verbose
            report_error(internal_error(exc))
            ctx.exit(1)


def internal_error(exc: Exception) -> SpdflowError:
    """An unexpected exception as a one-sentence error; its traceback stays in ``__cause__``."""
    lines = str(exc).strip().splitlines()
    error = SpdflowError(f"internal error: {type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": "))
    error.__cause__ = exc
    return error


@click.group(cls=SpdflowGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="spdflow")
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks on errors.")
def cli(verbose: bool) -> None:
    """spdflow — speculative decoding recipes for static-shape accelerators.

    \b
      spdflow run recipes/tinycode_varK.yaml    export → specialize → compile → generate → report
      spdflow lint recipes/                      schema + semantic checks (exit 1 on findings)
      spdflow bench recipes/tinycode_varK.yaml   no-spec vs fixed-K vs varK side by side
      spdflow whatif runs/tinycode-varK --k-list 0,4 --batch-size 8
                                                 replay a run under another K-list, policy, batch
      spdflow sweep recipes/sweeps/tinycode_klists.yaml   a matrix of recipes, one report
      spdflow advise runs/tinycode-varK --max-shapes 2
                                                 rank K-lists to compile, from replays
      spdflow plugins                            installed plugins, hooks and names

    Exit codes: 0 ok, 1 run failure or lint findings, 2 usage, 3 invalid recipe,
    4 plugin fault, 5 lossless check failed, 130 interrupted, 143 terminated.
    """
    click.get_current_context().meta[VERBOSE_KEY] = verbose


def _pm():
    from spdflow.plugins import get_plugin_manager

    return get_plugin_manager()


set_option = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                          help="Override a recipe key (dotted path; value parsed as YAML). Repeatable.")


allow_outside_option = click.option(
    "--allow-outside-paths", is_flag=True,
    help="Let the recipe read files outside its own folder (model dirs, workload.file); off by default so an "
         "untrusted recipe cannot read arbitrary files.")


@cli.command()
@click.argument("recipe", type=click.Path(dir_okay=False, path_type=Path))
@set_option
@click.option("--force", is_flag=True, help="Rerun every stage, ignoring the cache.")
@click.option("--from", "from_stage", type=click.Choice(["export", "specialize", "compile", "generate"]),
              help="Rerun this stage and the ones after it.")
@click.option("--dry-run", is_flag=True, help="Print the plan (stages, specializations, compile command); run nothing.")
@click.option("--compile-only", is_flag=True, help="Export and write the compiled program's files (and compile.sh); do not generate.")
@click.option("--check-lossless", is_flag=True,
              help="Also run the no-spec baseline and record whether every request's tokens are identical "
                   "(the report then states the measured speed-up too).")
@click.option("--baseline", is_flag=True,
              help="Also run the no-spec baseline in this process and report the measured speed-up over it.")
@click.option("--verify", is_flag=True, help="Hash every cached file in full before reusing it (otherwise only files whose size or time changed are hashed).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path), help="Also write report.json here.")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Keep exports and compiled programs here instead of the run dir; runs naming one dir share them.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@click.option("--json", "as_json", is_flag=True, help="Print the report JSON on stdout instead of the summary table.")
@allow_outside_option
def run(recipe, overrides, force, from_stage, dry_run, compile_only, check_lossless, baseline, verify, report_path,
        cache_dir, quiet, as_json, allow_outside_paths):
    """Run RECIPE: export, specialize, compile, generate, and write the run report."""
    from spdflow.engine.run import RunOptions
    from spdflow.recipe.loader import load_recipe
    from spdflow.runner import dry_run_plan, run_recipe

    pm = _pm()
    loaded = load_recipe(recipe, pm, list(overrides))
    loaded.allow_outside_paths = allow_outside_paths
    options = RunOptions(force=force, from_stage=from_stage, compile_only=compile_only,
                         check_lossless=check_lossless, baseline=baseline, verify=verify, report_path=report_path,
                         cache_dir=cache_dir)
    if dry_run:
        text, blockers = dry_run_plan(pm, loaded, options)
        click.echo(text)
        if blockers:
            from spdflow.errors import PreflightError

            raise PreflightError(f"`spdflow run` would stop before any export: {len(blockers)} problem(s)",
                                 findings=blockers, hint="fix them, then run without --dry-run")
        return
    report = run_recipe(pm, loaded, options, quiet=quiet, summary=not as_json)
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))


def _codes(values: tuple[str, ...]) -> list[str]:
    return [code.strip().upper() for value in values for code in value.split(",") if code.strip()]


@cli.command()
@click.argument("paths", nargs=-1, required=True)
@set_option
@click.option("--format", "fmt", type=click.Choice(["text", "json", "github"]), default="text", show_default=True)
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
@click.option("--exclude", multiple=True, metavar="GLOB",
              help="Skip paths matching GLOB (whole path or any folder/file name). Repeatable.")
@click.option("--select", multiple=True, metavar="CODES", help="Report only these codes or prefixes (e.g. SPD1,SPD034).")
@click.option("--ignore", multiple=True, metavar="CODES", help="Do not report these codes or prefixes (e.g. SPD104).")
@click.option("--recipe-glob", multiple=True, metavar="GLOB",
              help="In directories, files matching GLOB are recipes whatever their content. Repeatable.")
@click.option("--recipes-only", is_flag=True,
              help="Skip named files that do not look like recipes too (for pre-commit, which passes every YAML file).")
@click.option("--no-gitignore", is_flag=True, help="Also walk into what git ignores.")
def lint(paths, overrides, fmt, strict, exclude, select, ignore, recipe_glob, recipes_only, no_gitignore):
    """Check recipes (files, directories, globs): schema errors, semantic rules, and the preflight
    checks `run` does before any export (models, prompt files and lengths, shapes, backend).

    \b
    A directory is walked for files that look like recipes (a top-level `version:` and another
    recipe key, or --recipe-glob), skipping what git ignores. A finding is silenced on its line
    with `# spdflow: noqa SPD104`, in the whole file with `# spdflow: noqa-file SPD104`.

    Exit 0 clean (warnings allowed unless --strict), 1 findings, 3 unreadable or invalid recipe.
    """
    from spdflow import lint as linting

    options = linting.LintOptions(exclude=list(exclude), select=_codes(select), ignore=_codes(ignore),
                                  recipe_globs=list(recipe_glob), recipes_only=recipes_only, gitignore=not no_gitignore)
    result = linting.lint_paths(list(paths), _pm(), list(overrides), options)
    text = linting.render(result, fmt)
    if text:
        click.echo(text)
    sys.exit(result.exit_code(strict))


@cli.command()
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Write to a file instead of stdout.")
@click.option("--sweep", "for_sweep", is_flag=True,
              help="The sweep file's schema instead (its inline base refers to recipe.schema.json beside it).")
@click.option("--with-fields", is_flag=True,
              help="Markdown tables of the built-in plugins' with: settings instead (README's recipe reference).")
def schema(output, for_sweep, with_fields):
    """Print the recipe's JSON Schema, including every installed plugin's config.

    Use it from an editor with a first line `# yaml-language-server: $schema=<file>`.
    """
    from spdflow.recipe.jsonschema import recipe_json_schema, with_fields_markdown
    from spdflow.sweep.spec import sweep_json_schema

    if with_fields:
        text = with_fields_markdown(_pm()).rstrip("\n")
    else:
        text = json.dumps(sweep_json_schema() if for_sweep else recipe_json_schema(_pm()), indent=2)
    if output:
        from spdflow.files import write_text_atomic

        write_text_atomic(output, text + "\n")
    else:
        click.echo(text)


@cli.command()
@click.option("--format", "fmt", type=click.Choice(["json", "table"]), default="json", show_default=True)
def plugins(fmt):
    """List installed plugins: distribution, version, hooks, registered names, load errors."""
    from dataclasses import asdict

    infos = _pm().describe()
    if fmt == "json":
        click.echo(json.dumps([asdict(i) for i in infos], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("plugin", "distribution", "version", "registers", "hooks", "error")
    for i in infos:
        registers = "; ".join(f"{k}: {', '.join(v)}" for k, v in i.registered.items())
        table.add_row(i.name, i.distribution or "", i.version or "", registers, ", ".join(h.removeprefix("spdflow_") for h in i.hooks),
                      i.error or "")
    Console().print(table)


from spdflow.bench_cli import bench  # noqa: E402  (a command module, kept apart from this file)
from spdflow.whatif_cli import advise, whatif  # noqa: E402

cli.add_command(bench)
cli.add_command(whatif)
cli.add_command(advise)

from spdflow.sweep_cli import sweep  # noqa: E402

cli.add_command(sweep)


def main() -> None:
    from spdflow.engine import signals

    # SIGINT/SIGTERM at any moment end like Ctrl-C (exit 130/143), even if the shell made this
    # process ignore SIGINT; one swallowed during start-up is still seen by the run's checks.
    signals.install()
    cli(prog_name="spdflow")
