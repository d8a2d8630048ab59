"""``spdflow whatif`` and ``spdflow advise``: parse, call :mod:`spdflow.whatif` /
:mod:`spdflow.advise`, render. Results on stdout, progress and errors on stderr."""
from __future__ import annotations

import json
from pathlib import Path

import click

from spdflow.bench_cli import parse_list
from spdflow.errors import UsageError

cost_option = click.option("--cost", "cost_name", default="measured", show_default=True,
                           help="Cost model pricing each verify: measured (timed on the run's own backend), "
                                "table, roofline, or a plugin's.")
cost_with_option = click.option("--cost-with", "cost_with", multiple=True, metavar="KEY=VALUE",
                                help="A setting of the cost model (value parsed as YAML), e.g. profile=ai100-ultra. "
                                     "Repeatable.")


def parse_settings(items) -> dict:
    """KEY=VALUE items -> {key: YAML value}; a malformed item is a usage error."""
    import yaml

    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--cost-with expects KEY=VALUE, got '{item}'")
        try:
            settings[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            settings[key.strip()] = value
    return settings


def _fmt(value, spec=".1f"):
    return "—" if value is None else format(value, spec)


def k_usage_text(usage: dict, steps: int) -> str:
    if not steps:
        return "—"
    return " ".join(f"K{k}:{100 * n / steps:.0f}%" for k, n in sorted(usage.items()))


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--k-list", "k_list", help="Comma-separated K-list to replay under, e.g. 0,4 (default: the run's).")
@click.option("--policy", help="K policy (default: the run's), e.g. smallest_covering, goodput, fixed, nospec.")
@click.option("--batch-size", "batch_sizes", help="Comma-separated batch sizes (default: the run's).")
@cost_option
@cost_with_option
@click.option("--oracle", is_flag=True,
              help="Instead: the best K schedule knowing what each K would accept (greedy runs; at batch > 1 one K "
                   "per step for every row, the best a beam search finds), beside the policy, no-spec and every "
                   "fixed K of the run's list, all priced alike: policy efficiency (policy ÷ oracle) and regret "
                   "against the best static choice.")
@click.option("--json", "as_json", is_flag=True, help="Print the predictions as JSON.")
def whatif(run_dir, k_list, policy, batch_sizes, cost_name, cost_with, oracle, as_json):
    """Replay the finished run in RUN_DIR under another K-list, K policy or batch size, and price
    every step with a cost model.

    The proposer runs over the recorded outputs, so for a greedy run with a deterministic
    proposer and policy the proposals, acceptance, step count and K usage are exact; only the
    verify times come from the cost model. Prints predicted tokens/s, steps, K usage and AL
    beside the run's own measured figures.
    """
    from spdflow import whatif as wi
    from spdflow.plugins import get_plugin_manager

    pm = get_plugin_manager()
    run = wi.load_run(run_dir, pm)
    own = wi.own_scenario(run)
    ks = tuple(sorted(set(parse_list(k_list, "k-list", int)))) if k_list else own.k_list
    sizes = parse_list(batch_sizes, "batch-size", int) or [own.batch_size]
    policy_name = policy or own.policy
    pm.lookup("k_policy", policy_name)
    scenarios = [wi.Scenario(ks, policy_name, b) for b in sizes]
    cost = wi.make_cost_model(pm, run, cost_name, parse_settings(cost_with))
    if oracle:
        from spdflow.oracle import oracle_report

        reports = [oracle_report(pm, run, cost, policy_name, b) for b in sizes]
        if as_json:
            data = reports[0].to_json() if len(reports) == 1 else [r.to_json() for r in reports]
            click.echo(json.dumps(data, indent=2))
        else:
            click.echo("\n\n".join(render_oracle(r) for r in reports))
        return
    wi.prepare(cost, scenarios)
    predictions = [wi.replay(pm, run, s, cost) for s in scenarios]
    measured = wi.own_figures(run)
    if as_json:
        click.echo(json.dumps({"run_dir": str(run_dir), "run": {"k_list": list(own.k_list), "policy": own.policy,
                                                                 "batch_size": own.batch_size, **measured.to_json()},
                               "cost": cost.describe(), "predictions": [p.to_json() for p in predictions]},
                              indent=2, default=str))
        return
    click.echo(render_whatif(own, measured, predictions, cost))


def render_oracle(report) -> str:
    """The oracle beside the policy and the static choices at one batch size."""
    lines = [f"| schedule (batch {report.batch_size}) | tok/s | vs oracle |", "|---|---|---|"]

    def row(label, tps):
        lines.append(f"| {label} | {_fmt(tps)} | {tps / report.oracle_tokens_per_s:.3f} |")

    row(f"{report.oracle_label} ({report.oracle_steps} steps, {k_usage_text(report.oracle_k_usage, report.oracle_steps)})",
        report.oracle_tokens_per_s)
    row(f"policy {report.policy}", report.policy_tokens_per_s)
    row("no-spec", report.nospec_tokens_per_s)
    for k, tps in sorted(report.fixed_tokens_per_s.items()):
        row(f"fixed K={k}", tps)
    lines += ["", f"policy efficiency {report.efficiency:.3f} (policy ÷ oracle); regret {report.regret * 100:+.1f}% "
                  "(policy ÷ max(no-spec, best fixed K) − 1)"]
    if not report.exact:
        lines.append(f"note: at batch {report.batch_size} the oracle is the best schedule a beam of {report.width} "
                     "states per step found, a lower bound on the best possible: the policy's efficiency may exceed 1")
    return "\n".join(lines)


def render_whatif(own, measured, predictions, cost) -> str:
    """The whatif table (markdown-ish plain text) with the cost model's provenance and notes."""
    head = "| | K-list | policy | batch | tok/s | decode tok/s | steps | AL | K usage |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]

    def row(label, scenario, f):
        lines.append(f"| {label} | {list(scenario.k_list)} | {scenario.policy} | {scenario.batch_size} | "
                     f"{_fmt(f.tokens_per_s)} | {_fmt(f.decode_tokens_per_s)} | {f.steps} | {_fmt(f.al, '.2f')} | "
                     f"{k_usage_text(f.k_usage, f.steps)} |")

    row("run (measured)", own, measured)
    for p in predictions:
        row("predicted" + ("" if p.exact else " (estimate)"), p.scenario, p.figures)
    info = cost.describe()
    lines.append("")
    lines.append(f"cost model: {info.get('cost_model', cost.name)} — " +
                 "; ".join(f"{k}: {v}" for k, v in info.items() if k not in ("cost_model", "batches", "sources")))
    for key, source in (info.get("sources") or {}).items():
        lines.append(f"  {key}: {source}")
    notes = sorted({n for p in predictions for n in p.notes})
    if all(p.exact for p in predictions):
        notes.insert(0, "greedy replay: proposals, acceptance, steps and K usage are exact; times are priced")
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--max-shapes", default=3, show_default=True, type=int, help="Most decode shapes (K values) a list may have.")
@click.option("--k-max", "k_max", type=int, help="Largest K to consider (default: the largest K of the runs' K-lists).")
@click.option("--batch-size", "batch_sizes", help="Comma-separated batch sizes to rank at (default: each run's own).")
@click.option("--policies", help="Comma-separated K policies to try for lists of two or more K.  "
                                 "[default: smallest_covering, the reference policy]")
@click.option("--per-shape-cost", default=0.0, show_default=True, type=float,
              help="Score penalty per decode shape beyond the first (0.02: 2 % each), for compile time and memory.")
@click.option("--top", default=5, show_default=True, type=int, help="How many lists to print.")
@cost_option
@cost_with_option
@click.option("--json", "as_json", is_flag=True, help="Print the ranking as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def advise(run_dirs, max_shapes, k_max, batch_sizes, policies, per_shape_cost, top, cost_name, cost_with, as_json,
           quiet):
    """Rank K-lists to compile for the runs in RUN_DIRS: every list of at most --max-shapes K
    values from 0..--k-max, under each K policy, replayed over every run at every batch size and
    priced by the cost model; prints the best lists with their predicted gain over no-spec and
    over the best fixed K, and the recipe lines to paste."""
    from spdflow import whatif as wi
    from spdflow.advise import advice_json, advise as rank, render_advice
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.schema import REFERENCE_POLICY

    pm = get_plugin_manager()
    runs = [wi.load_run(d, pm) for d in run_dirs]
    settings = parse_settings(cost_with)
    costs = [wi.make_cost_model(pm, run, cost_name, settings) for run in runs]
    sizes = parse_list(batch_sizes, "batch-size", int) or sorted({run.batch_size for run in runs})
    k_max = k_max if k_max is not None else max(max(run.recipe.k_list()) for run in runs)
    progress = (lambda text: None) if quiet else (lambda text: click.echo(text, err=True))
    advice = rank(pm, runs, costs, sizes, max_shapes=max_shapes, k_max=k_max,
                  policies=parse_list(policies, "policies") or [REFERENCE_POLICY], per_shape_cost=per_shape_cost,
                  progress=progress)
    if as_json:
        click.echo(json.dumps(advice_json(advice, runs, top), indent=2, default=str))
    else:
        click.echo(render_advice(advice, runs, top))
