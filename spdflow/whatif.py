"""What-if replay: a recorded run under another K-list, K policy, batch size or device.

Greedy SpD is lossless, so a greedy run's token path does not depend on the K-list or the
policy. :func:`replay` drives the real generation loop (:class:`spdflow.engine.generate.Generator`)
with the run's own proposer, K policy and acceptor, but the target is a :class:`ReplaySession`
that answers every verify with the token the run recorded at that position (one-hot logits).
So the proposer sees exactly the token prefixes it would see for real, and the acceptor accepts
exactly what the target would have accepted; only the time of each verify is not real: the
session takes none and puts the priced time of a :class:`spdflow.api.CostModel` on the
generator's clock instead (:class:`ReplayClock`). The proposer's and the engine's own (host)
time are measured as they happen, on this machine.

What is exact and what is not (stated with every prediction, :func:`fidelity`):

* greedy run, deterministic proposer (prompt lookup, suffix, draft model, synthetic) and a
  policy that decides from proposals alone (smallest_covering, fixed, nospec): proposals,
  acceptance, step count and K usage are exact; a draft model is re-run for real;
* a policy that learns from timings (goodput) sees priced verify times and this machine's host
  time, so its choices are a prediction of what it would do on that device;
* a sampled run: a proposal is accepted when it equals the token the run sampled there, which
  on average is the chance the target samples it (exact on average for point-mass proposals,
  an underestimate for proposals with draft probabilities); an estimate.

Proposers that read the target's own outputs (``target_outputs``: multi_projection's head
logits, eagle's hidden states) are refused: a run records tokens, not those outputs.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from spdflow.api import CostContext, CostModel, ModelInfo, Request, Sampling
from spdflow.errors import RunDataError, UsageError
from spdflow.hookspecs import hookimpl
from spdflow.bench import own_settings
from spdflow.plugins import make_k_policy, required_ks, resolve_acceptance, speculates
from spdflow.recipe.schema import KPolicySpec

#: logit of every token but the recorded one: exp(LOW / T) is 0 for any temperature spdflow allows
LOW = -1.0e4


# ------------------------------------------------------------------------------ the run


@dataclass
class RunData:
    """A finished run, as replay needs it."""

    run_dir: Path
    report: dict
    loaded: Any  # spdflow.recipe.loader.LoadedRecipe
    model_info: ModelInfo
    requests: list[Request]
    outputs: dict[int, np.ndarray]  # generated tokens per request index
    records: list[dict]
    trace_version: int

    @property
    def recipe(self):
        return self.loaded.recipe

    @property
    def batch_size(self) -> int:
        spec = self.recipe.specialization
        return spec.full_batch_size or spec.batch_size


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunDataError(f"'{path.parent}' is not a finished spdflow run (no {path.name})",
                           hint="point at the run's output directory (runs/<name>), or rerun the recipe") from None
    except (OSError, ValueError) as exc:
        raise RunDataError(f"'{path}' is unreadable: {exc}", hint="rerun the recipe") from exc


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise RunDataError(f"'{path.parent}' is not a finished spdflow run (no {path.name})",
                           hint="point at the run's output directory (runs/<name>), or rerun the recipe")
    from spdflow.report.metrics import read_trace

    try:
        return read_trace(path)
    except (OSError, ValueError) as exc:
        raise RunDataError(f"'{path}' is unreadable: {exc}", hint="rerun the recipe") from exc


def _model_info(run_dir: Path, report: dict) -> ModelInfo:
    """The target's ModelInfo from the run's verified export (the report names its key)."""
    from spdflow.engine import cache

    export = next((s for s in report.get("stages", []) if s.get("name") == "export"), {})
    key = export.get("cache_key")
    candidates = sorted((run_dir / "export").glob(f"target-{key or ''}*"))
    if (export.get("detail") or {}).get("export_dir"):  # a shared cache dir (spdflow sweep, --cache-dir)
        candidates.insert(0, Path(export["detail"]["export_dir"]))
    for directory in candidates:
        marker, _ = cache.read_done(directory)
        if marker is not None and "model_info" in marker:
            return ModelInfo.from_json(marker["model_info"])
    raise RunDataError(f"'{run_dir}' has no verified target export (export/target-{key or '*'})",
                       hint="rerun the recipe; whatif reads the model's facts from its export")


def load_run(run_dir: Path | str, pm) -> RunData:
    """Read a run directory: report.json (recipe), outputs.jsonl (token ids), trace.jsonl."""
    from spdflow.recipe.loader import LoadedRecipe
    from spdflow.recipe.schema import Recipe
    from spdflow.report.metrics import check_trace_version

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDataError(f"'{run_dir}' is not a directory", hint="point at a run's output directory (runs/<name>)")
    report = _read_json(run_dir / "report.json")
    records = _read_jsonl(run_dir / "trace.jsonl")
    version = check_trace_version(records, run_dir / "trace.jsonl", minimum=2)
    if report.get("status") != "ok":
        raise RunDataError(f"the run in '{run_dir}' did not finish (status {report.get('status')!r})",
                           hint="replay needs a finished run; rerun the recipe")
    try:
        recipe = Recipe.model_validate(report["recipe"])
    except Exception as exc:
        raise RunDataError(f"the recipe stored in '{run_dir / 'report.json'}' does not validate: {exc}".splitlines()[0],
                           hint="rerun the recipe with this spdflow") from exc
    recipe_path = Path(report.get("recipe_path") or run_dir / "recipe.yaml")
    proposer_config = None
    if recipe.proposer is not None:
        registration = pm.lookup("proposer", recipe.proposer.uses)
        if registration.config is not None:
            proposer_config = registration.config.model_validate(recipe.proposer.with_)
    loaded = LoadedRecipe(recipe, recipe_path, None, proposer_config)
    info = _model_info(run_dir, report)
    workload = recipe.workload
    requests, outputs = [], {}
    for row in _read_jsonl(run_dir / "outputs.jsonl"):
        if "prompt_tokens" not in row or "tokens" not in row:
            raise RunDataError(f"'{run_dir / 'outputs.jsonl'}' has no token ids for request {row.get('request')}",
                               hint="rerun the recipe with this spdflow (outputs.jsonl records prompt and output ids)")
        index = int(row["request"])
        requests.append(Request(index, row.get("prompt", ""), np.asarray(row["prompt_tokens"], dtype=np.int64),
                                workload.max_new_tokens, workload.seed))
        outputs[index] = np.asarray(row["tokens"], dtype=np.int64)
    requests.sort(key=lambda r: r.index)
    if [r.index for r in requests] != list(range(len(requests))):
        raise RunDataError(f"'{run_dir / 'outputs.jsonl'}' does not hold every request 0..n-1",
                           hint="rerun the recipe")
    return RunData(run_dir, report, loaded, info, requests, outputs, records, version)


# ------------------------------------------------------------------------------ replay session


class ReplayClock:
    """The generator's clock in a replay: real time, except that every verify run takes exactly
    its priced time.

    The real time from the clock reading before a verify (the generator's ``verify_start``) to
    the reading after it — hook dispatch and the replay session's own work — is replaced by the
    price. Host work between two runs with no reading between them (prefill chunks) stays real.
    With ``priced_only`` no real time passes at all: for a cost model whose step times include
    the host's work, and for one that charges both host time per step and each proposer call.
    """

    def __init__(self, priced_only: bool = False) -> None:
        self.offset = 0.0
        self._last_real = time.perf_counter()
        self._after_run = False
        #: only priced time passes (see the class docstring)
        self.priced_only = priced_only

    def __call__(self) -> float:
        if self.priced_only:
            return self.offset
        now = time.perf_counter()
        if self._after_run:  # drop the dispatch time since the run ended
            self.offset -= now - self._last_real
            self._after_run = False
        self._last_real = now
        return now + self.offset

    def priced(self, seconds: float) -> None:
        """A run just ended and costs ``seconds``: replace the real time since the last event."""
        if self.priced_only:
            self.offset += seconds
            return
        now = time.perf_counter()
        self.offset += seconds - (now - self._last_real)
        self._last_real = now
        self._after_run = True

    def start_run(self) -> None:
        """A run starts; host work since the previous run (no reading between) stays real."""
        if self._after_run:
            self._last_real = time.perf_counter()


class ReplaySession:
    """A target session that answers every verify with the recorded tokens (one-hot logits) and
    puts the priced time of that run on the clock.

    Requests take slots in the order the generator admits them (request order, free slots
    ascending, as the generator does); a row whose first position is 0 starts the next one.
    """

    def __init__(self, run: RunData, rows: int, cost: CostModel, clock: ReplayClock, prefill_seq_len: int,
                 measured_prefill_s: float | None):
        self.kv_batch_size = rows
        self.ctx_len = run.recipe.specialization.ctx_len
        self.vocab_size = run.model_info.vocab_size
        self.specializations = []
        self.cost, self.clock, self.rows = cost, clock, rows
        self.prefill_seq_len = prefill_seq_len
        self.measured_prefill_s = measured_prefill_s
        self.sequences = {r.index: np.concatenate([r.prompt_ids, run.outputs[r.index]]) for r in run.requests}
        self.prompts = {r.index: r.prompt_ids for r in run.requests}
        self.queue = [r.index for r in run.requests]
        self.slot_request: dict[int, int] = {}
        self.last_shape: Any = None
        self.buffers: dict[tuple[int, int], np.ndarray] = {}
        self.marked: dict[tuple[int, int], tuple] = {}
        self.pad = int(run.model_info.pad_token_id)

    def price(self, rows: int, seq_len: int, keep: int) -> float:
        """Priced seconds of one run: a decode shape keeps every row's logits (K+1), prefill one."""
        if keep == seq_len:
            k = seq_len - 1
            seconds = self.cost.verify_s(rows, k)
            if self.last_shape is not None and self.last_shape != k:
                seconds += self.cost.switch_s(rows)
            self.last_shape = k
            return seconds
        self.last_shape = "prefill"
        seconds = self.cost.prefill_s(rows, seq_len)
        if seconds is None:
            seconds = self.measured_prefill_s if self.measured_prefill_s is not None else 0.0
        return seconds

    def run(self, input_ids, position_ids, num_logits_to_keep, batch_index=None):
        self.clock.start_run()
        rows, seq_len = input_ids.shape
        keep = int(num_logits_to_keep)
        key = (rows, keep)
        logits = self.buffers.get(key)
        if logits is None:
            logits = self.buffers[key] = np.full((rows, keep, self.vocab_size), LOW, dtype=np.float32)
        elif key in self.marked:
            logits[self.marked[key]] = LOW
        marks: tuple[list, list, list] = ([], [], [])
        for r in range(rows):
            positions = position_ids[r]
            valid = positions >= 0
            if not valid.any():
                continue
            slot = int(batch_index[r, 0]) if batch_index is not None else r
            if positions[0] == 0:
                self._start(slot, input_ids[r][valid])
            request = self.slot_request.get(slot)
            if request is None:
                raise RunDataError(f"the replay verified slot {slot} before any request was prefilled there")
            sequence = self.sequences[request]
            # logits row j belongs to the last `keep` columns of the row
            for j in range(keep):
                column = seq_len - keep + j
                position = int(positions[column]) if keep == seq_len else int(positions[valid][-1])
                if position < 0:
                    continue
                token = int(sequence[position + 1]) if position + 1 < len(sequence) else self.pad
                marks[0].append(r), marks[1].append(j), marks[2].append(token)
        index = tuple(np.asarray(m, dtype=np.intp) for m in marks)
        logits[index] = 0.0
        self.marked[key] = index
        self.clock.priced(self.price(rows, seq_len, keep))
        return logits

    def _start(self, slot: int, first_chunk: np.ndarray) -> None:
        if not self.queue:
            raise RunDataError("the replay admitted more requests than the run recorded")
        request = self.queue.pop(0)
        prompt = self.prompts[request]
        n = min(len(first_chunk), len(prompt))
        if not np.array_equal(prompt[:n], first_chunk[:n]):
            raise RunDataError(f"the replay's prefill of request {request} does not match its recorded prompt",
                               hint="the run's outputs.jsonl and its recipe disagree; rerun the recipe")
        self.slot_request[slot] = request

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------ scenarios and predictions


@dataclass(frozen=True)
class Scenario:
    """One what-if: a K-list, a K policy and a batch size (KV rows under continuous batching)."""

    k_list: tuple[int, ...]
    policy: str
    batch_size: int

    def label(self) -> str:
        return f"K-list {list(self.k_list)}, {self.policy}, batch {self.batch_size}"


@dataclass
class Figures:
    """What a run did (measured) or would do (predicted), in the same terms."""

    tokens_per_s: float | None  # generated tokens / wall time, prefill included (bench's tok/s)
    decode_tokens_per_s: float | None
    steps: int
    k_usage: dict[int, int]
    al: float | None
    wall_s: float
    verify_s: float
    propose_s: float
    host_s: float
    prefill_s: float
    generated_tokens: int

    @staticmethod
    def from_records(records: list[dict]) -> "Figures":
        from spdflow.report.metrics import compute_metrics

        m = compute_metrics(records)
        return Figures(m.e2e_tokens_per_s, m.decode_tokens_per_s, m.decode_steps,
                       {int(k): v for k, v in sorted(m.k_histogram.items())}, m.mean_acceptance_length, m.wall_s,
                       m.verify_s, m.propose_s, m.host_s, m.prefill_time_s, m.generated_tokens)

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["k_usage"] = {str(k): v for k, v in self.k_usage.items()}
        return data


@dataclass
class Prediction:
    scenario: Scenario
    figures: Figures
    exact: bool  # proposals, acceptance, steps and K usage are exact (not the time)
    notes: list[str] = field(default_factory=list)
    identical: bool = True  # the replay emitted exactly the recorded tokens

    def to_json(self) -> dict:
        return {"k_list": list(self.scenario.k_list), "policy": self.scenario.policy,
                "batch_size": self.scenario.batch_size, **self.figures.to_json(), "exact_token_path": self.exact,
                "replayed_tokens_identical": self.identical, "notes": self.notes}


def fidelity(run: RunData, policy_name: str, pm) -> tuple[bool, list[str]]:
    """Whether a replay's token path, steps and K usage are exact, and what to say when not."""
    notes = []
    exact = True
    if run.recipe.workload.temperature > 0:
        exact = False
        notes.append("sampled run: a proposal counts as accepted when it equals the token the run sampled there, "
                     "on average the chance the target samples it (an underestimate for proposals with draft "
                     "probabilities); an estimate")
    policy = make_k_policy(pm, policy_name, own_settings(run.recipe, policy_name))
    if _overrides(policy, "start") or _overrides(policy, "observe"):
        exact = False
        notes.append(f"K policy '{policy_name}' learns from step times: its choices follow the priced verify times "
                     "and this machine's host time, a prediction")
    return exact, notes


def _overrides(policy, method: str) -> bool:
    """Whether the policy implements ``method`` itself (start: it may ask for measured step
    costs; observe: it learns from step times)."""
    from spdflow.api import KPolicy

    return getattr(type(policy), method, None) is not getattr(KPolicy, method)


def measured_prefill(run: RunData) -> float | None:
    """Median seconds of one prefill chunk in the run (its own batch size)."""
    groups = {}
    for r in run.records:
        if r.get("kind") == "prefill" and r.get("chunks"):
            groups[round(float(r["t"]), 9)] = float(r["duration_s"]) / int(r["chunks"])
    return float(np.median(list(groups.values()))) if groups else None


def replay(pm, run: RunData, scenario: Scenario, cost: CostModel) -> Prediction:
    """Replay ``run`` under ``scenario`` with verify times from ``cost``."""
    from spdflow.bench import batch_recipe
    from spdflow.engine.generate import Generator, LoopConfig
    from spdflow.engine.run import Engine, NullUI, RunOptions

    settings = own_settings(run.recipe, scenario.policy)
    policy = make_k_policy(pm, scenario.policy, settings)
    check_scenario(run, scenario, policy)
    check_replayable_proposer(pm, run, scenario, policy)
    recipe = batch_recipe(run.recipe, scenario.batch_size)
    recipe = recipe.model_copy(update={"num_speculative_tokens": list(scenario.k_list),
                                       "k_policy": KPolicySpec(uses=scenario.policy, **{"with": settings}),
                                       "output": str(run.run_dir)})
    loaded = dataclasses.replace(run.loaded, recipe=recipe)
    spec, info, workload = recipe.specialization, run.model_info, recipe.workload
    sampling = Sampling(workload.temperature, workload.top_k, workload.top_p)
    with_proposer = recipe.proposer is not None and speculates(policy, scenario.k_list)
    config = LoopConfig(spec.prefill_seq_len, spec.ctx_len, spec.batch_size, spec.full_batch_size,
                        list(scenario.k_list) if with_proposer else [0], info.eos_token_ids, info.pad_token_id,
                        info.vocab_size, sampling, workload.ignore_eos)
    whole = bool(getattr(cost, "includes_host", False))
    host, per_call = (None, None) if whole else (getattr(cost, "host_per_step_s", None),
                                                 getattr(cost, "propose_per_call_s", None))
    # host and proposer both charged: nothing real is left to count, and the replay is repeatable
    clock = ReplayClock(priced_only=whole or (host is not None and per_call is not None))
    rows = spec.full_batch_size or spec.batch_size
    session = ReplaySession(run, rows, cost, clock, spec.prefill_seq_len, measured_prefill(run))
    engine = Engine(pm, loaded, RunOptions(), NullUI())
    acceptor = pm.lookup("acceptor", resolve_acceptance(pm, recipe)).factory()
    proposer, name = None, ""
    if with_proposer:
        reference = dict(run.outputs)
        proposer, name = engine.make_proposer(info, sampling, reference), recipe.proposer.uses
    records: list[dict] = []
    generator = Generator(pm, session, config, proposer=proposer, proposer_name=name, policy=policy,
                          acceptor=acceptor, trace=records.append, clock=clock)
    charged = _ChargedProposer(clock, per_call) if per_call is not None and proposer is not None else None
    if charged is not None:
        pm.register(charged)
    try:
        results = generator.generate(run.requests)
    finally:
        if charged is not None:
            pm.unregister(charged)
        if proposer is not None:
            proposer.close()
        engine.close_sessions()
    identical = all(np.array_equal(r.tokens, run.outputs[r.index]) for r in results)
    exact, notes = fidelity(run, scenario.policy, pm) if with_proposer else (run.recipe.workload.temperature == 0, [])
    if whole:
        notes.append(f"cost model '{cost.name}' prices whole steps (host and proposer included): only priced time counts")
    if not identical:
        notes.append("the replay did not emit the recorded tokens: the run was not lossless or its files disagree; "
                     "this prediction is not trustworthy")
    figures = Figures.from_records(records)
    if host is not None and figures.steps:
        figures = charge_host(figures, host)
        notes.append(f"host time: the run's own {host * 1e3:.3f} ms per step (the replay's own host work runs with "
                     "no real backend beside it and is cheaper than a generation's)")
    if charged is not None:
        notes.append(f"proposer time: {per_call * 1e3:.3f} ms per call, as the cost model says (not what the "
                     "proposer took in this replay)")
    cautions = cost.cautions(rows)
    if not isinstance(cautions, list) or not all(isinstance(c, str) for c in cautions):
        from spdflow.errors import PluginError

        raise PluginError(f"cost model '{cost.name}' returned {type(cautions).__name__} from cautions({rows}); "
                          "it must return a list of sentences (str)")
    notes += cautions
    return Prediction(scenario, figures, exact and identical, notes, identical)


class _ChargedProposer:
    """A plugin that puts every proposer call of a replay on its clock at one price."""

    def __init__(self, clock: ReplayClock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    @hookimpl(hookwrapper=True)
    def spdflow_propose(self, proposer, inputs):
        yield
        self.clock.priced(self.seconds)  # the call's real time is replaced, as a verify run's is


def charge_host(figures: Figures, host_per_step_s: float) -> Figures:
    """``figures`` with every step's host time set to ``host_per_step_s`` (wall and rates follow)."""
    delta = figures.steps * host_per_step_s - figures.host_s
    wall = figures.wall_s + delta
    decode = None
    if figures.decode_tokens_per_s:
        decode_s = figures.generated_tokens / figures.decode_tokens_per_s + delta
        decode = figures.generated_tokens / decode_s if decode_s > 0 else None
    return dataclasses.replace(figures, wall_s=wall, host_s=figures.host_s + delta, decode_tokens_per_s=decode,
                               tokens_per_s=figures.generated_tokens / wall if wall > 0 else None)


def check_scenario(run: RunData, scenario: Scenario, policy) -> None:
    """One sentence for a scenario the run cannot be replayed under (``policy``: the scenario's
    K policy, asked which Ks it needs)."""
    ks = scenario.k_list
    if not ks or min(ks) < 0:
        raise UsageError(f"--k-list must hold K values ≥ 0, got {list(ks)}")
    if scenario.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    if run.recipe.proposer is None and speculates(policy, ks):
        raise UsageError(f"K-list {list(ks)} needs a proposer but the run had none",
                         hint="replay a run that used a proposer, or ask for --k-list 0")
    missing = sorted(set(required_ks(policy, ks)) - set(ks))
    if missing:
        raise UsageError(f"policy '{scenario.policy}' needs K = {', '.join(map(str, missing))} in the K-list")
    if max(ks) + 1 > run.recipe.specialization.prefill_seq_len:
        raise UsageError(f"K = {max(ks)} needs prefill_seq_len ≥ {max(ks) + 1}, the run has "
                         f"{run.recipe.specialization.prefill_seq_len}")


def check_replayable_proposer(pm, run: RunData, scenario: Scenario, policy) -> None:
    """Refuse a proposer that reads the target's own outputs (multi_projection's head logits,
    eagle's hidden states): the replay's target answers with recorded tokens only, so such a
    proposer would see nothing and the prediction would be silently wrong."""
    proposer = run.recipe.proposer
    if proposer is None or not speculates(policy, scenario.k_list):
        return
    needs = getattr(pm.lookup("proposer", proposer.uses).factory, "target_outputs", ()) or ()
    if needs:
        raise UsageError(
            f"what-if cannot replay proposer '{proposer.uses}': it proposes from the target's "
            f"{' and '.join(needs)}, which a run does not record",
            hint="measure it with spdflow run or spdflow bench, or replay this run with --k-list 0")


def own_scenario(run: RunData) -> Scenario:
    """The run's own K-list, policy and batch size."""
    return Scenario(tuple(run.recipe.k_list()), run.recipe.k_policy.uses, run.batch_size)


def own_figures(run: RunData) -> Figures:
    """The run's own measured figures, from its trace."""
    return Figures.from_records(run.records)


# ------------------------------------------------------------------------------ cost models


def measure_on_backend(pm, run: RunData):
    """``measure(batch, ks)`` for CostContext: compiles the run's model for that batch size and
    K set on the run's own backend (cached in the run directory), times it, stores it in
    ``cost_grid.json``, and returns the entry. None when the run's backend cannot run here."""
    from spdflow.bench import batch_recipe
    from spdflow.costs import measure_grid, merge_entry, read_grid, write_grid
    from spdflow.engine.run import Engine, NullUI, RunOptions

    backend = pm.lookup("backend", run.recipe.devices.backend).factory()
    if backend.unavailable_reason():
        return None

    def measure(batch: int, ks: Sequence[int], gap_s: float = 0.0):
        ks = sorted(set(ks))
        recipe = batch_recipe(run.recipe, batch).model_copy(update={"num_speculative_tokens": ks,
                                                                     "output": str(run.run_dir)})
        loaded = dataclasses.replace(run.loaded, recipe=recipe)
        engine = Engine(pm, loaded, RunOptions(), NullUI())
        try:
            program, info = engine.build_model(recipe.model, "target", ks, recipe.devices)
            session = engine.open_session(program)
            spec = recipe.specialization
            entry = measure_grid(pm, session, spec.full_batch_size or spec.batch_size, ks, info.pad_token_id,
                                 spec.prefill_seq_len, spec.full_batch_size is not None, gap_s=gap_s)
        finally:
            engine.close_sessions()
        grid = read_grid(run.run_dir)
        grid[batch] = merge_entry(grid.get(batch), entry)
        write_grid(run.run_dir, grid, run.recipe.devices.backend)
        return grid[batch]

    return measure


def make_cost_model(pm, run: RunData, name: str, settings: dict | None = None) -> CostModel:
    """The registered cost model ``name`` for this run, its config validated from ``settings``."""
    from pydantic import ValidationError

    registration = pm.lookup("cost_model", name)
    config = None
    if registration.config is not None:
        try:
            config = registration.config.model_validate(settings or {})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "?"
            raise UsageError(f"--cost-with {where}: {first['msg']} (cost model '{name}')",
                             hint=f"settings of '{name}': {', '.join(registration.config.model_fields)}") from None
    elif settings:
        raise UsageError(f"cost model '{name}' takes no --cost-with settings")
    ctx = CostContext(run.run_dir, run.recipe, run.model_info, run.records, run.loaded.base_dir,
                      measure_on_backend(pm, run))
    model = registration.factory(config, ctx)
    if not isinstance(model, CostModel):
        raise_contract(name, registration.plugin, model)
    return model


def raise_contract(name: str, plugin: str, got: Any) -> None:
    from spdflow.errors import PluginError

    raise PluginError(f"cost model '{name}' (plugin '{plugin}') returned {type(got).__name__}, not a CostModel")


def prepare(cost: CostModel, scenarios: Sequence[Scenario]) -> None:
    """Let the cost model get ready for every (batch, K) the scenarios need (e.g. measure them)."""
    needs: dict[int, set[int]] = {}
    for s in scenarios:
        needs.setdefault(s.batch_size, set()).update(s.k_list)
    hook = getattr(cost, "prepare", None)
    if callable(hook):
        hook({b: sorted(ks | {0}) for b, ks in needs.items()})
