"""The proposer conformance suite: what every proposer must do, checked through the real engine.

Use it from a plugin's tests with one class::

    from spdflow.testing.conformance import ProposerConformance

    class TestRest(ProposerConformance):
        proposer = "rest"
        config = {"corpus": "/path/to/corpus"}

Each scenario runs a tiny random Llama (``tiny_model_dir``) on onnxruntime with the proposer
wrapped in a :class:`ContractChecker`, and with ``--check-lossless``: the greedy output must be
token-identical to no-spec decoding (batch 1, batch 3, continuous batching with more requests
than slots; K-lists [3], [0, 4] and [1, 2, 4, 7]); every proposal fits ``k_max`` and the
vocabulary; the context the engine shows the proposer always equals prompt + the tokens it was
told about (``add_request`` / ``on_accepted``); steps forced to K = 0 do not change what a
deterministic proposer proposes; a request stops at an EOS inside accepted drafts; and the
config round-trips through its schema. At temperature > 0 (``SAMPLED``, rejection sampling)
the generated tokens must be a sample of the target model's own distribution, computed
independently with torch from the same weights (:func:`sampled_fit`). Runs are cached per
session, so the whole suite costs about seven short generations per proposer.

A config that needs a path from a fixture overrides the ``proposer_config`` fixture instead of
setting ``config``. Use absolute paths: the suite writes its recipes in a temp directory.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest

from spdflow.api import KPolicy, Proposal, ProposeInput, Request
from spdflow.errors import SpdflowError
from spdflow.hookspecs import hookimpl
from spdflow.recipe.schema import REFERENCE_POLICY
from spdflow.testing import fixtures

#: The name under which the checked proposer runs, and the K policy that forces K = 0 steps.
CHECKED = "conformance_checked"
ALTERNATING = "conformance_alternating"


@dataclass(frozen=True)
class Scenario:
    """One engine run of the suite."""

    id: str
    k_list: tuple[int, ...]
    batch_size: int = 1
    full_batch_size: int | None = None
    prompts: int = 2
    k_policy: str = REFERENCE_POLICY
    model: str = "tiny"  # "tiny" or "eos" (tiny_eos_model_dir)
    #: (temperature, top_k) of a sampled scenario: every request gets the same prompt
    sampling: tuple[float, int] | None = None
    max_new_tokens: int | None = None  # None: MAX_NEW_TOKENS
    acceptance: str = "auto"  # the recipe's acceptance rule


SCENARIOS = (
    Scenario("batch1-K3", (3,)),
    Scenario("batch1-K0,4", (0, 4), prompts=4),
    Scenario("batch1-K0,4-alternating", (0, 4), prompts=4, k_policy=ALTERNATING),
    Scenario("batch3-K1,2,4,7", (1, 2, 4, 7), batch_size=3, prompts=3),
    Scenario("cb2-K0,4", (0, 4), full_batch_size=2, prompts=4),
    Scenario("eos-batch1-K1,2,4,7", (1, 2, 4, 7), prompts=3, model="eos"),
)
SCENARIO_IDS = [s.id for s in SCENARIOS]
#: The sampled scenario: 48 requests, 16 new tokens each, T = 1 with top-k 8, K-list [4]: the
#: tokens must be a sample of the target's own distribution (see :func:`sampled_fit`). Seeds
#: are fixed, so the outcome is reproducible.
SAMPLED = Scenario("sampled-batch8-K4", (4,), batch_size=8, prompts=48, sampling=(1.0, 8), max_new_tokens=16)
#: A sampled fit whose p-value is below this fails the suite (the runs are seeded: a failure
#: repeats; a correct proposer fails with about this probability over seeds).
SAMPLED_P_MIN = 1e-3
#: Equal-width bins of the PIT values in the chi-squared test.
PIT_BINS = 20
#: Decode steps cost ~1 ms on the tiny model; longer outputs give random models time to repeat
#: themselves, so lookup proposers get drafts accepted and rejected.
MAX_NEW_TOKENS = 40


# ------------------------------------------------------------------------------ the checker


@dataclass
class Recording:
    """What a ContractChecker saw during one run."""

    violations: list[str] = field(default_factory=list)
    #: (request index, context length) -> proposed tokens
    proposals: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    open_slots: set[int] = field(default_factory=set)
    eos_inside_drafts: int = 0


class ContractChecker:
    """Wraps a proposer; records contract violations instead of raising, so a test can list
    them all. Anything else is delegated to the wrapped proposer."""

    def __init__(self, inner, vocab_size: int, eos_ids: Sequence[int], recording: Recording):
        self.inner = inner
        self.vocab_size = vocab_size
        self.eos_ids = set(int(i) for i in eos_ids)
        self.recording = recording
        self.context: dict[int, list[int]] = {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _violation(self, text: str) -> None:
        self.recording.violations.append(text)

    def add_request(self, slot: int, request: Request) -> None:
        if slot in self.context:
            self._violation(f"add_request(slot={slot}) while the slot still holds a request")
        self.context[slot] = [int(t) for t in request.prompt_ids]
        self.recording.open_slots.add(slot)
        self.inner.add_request(slot, request)

    def on_accepted(self, slot: int, tokens: np.ndarray) -> None:
        if slot not in self.context:
            self._violation(f"on_accepted(slot={slot}) for a slot without a request")
        self.context.setdefault(slot, []).extend(int(t) for t in tokens)
        self.inner.on_accepted(slot, tokens)

    def remove_request(self, slot: int) -> None:
        self.context.pop(slot, None)
        self.recording.open_slots.discard(slot)
        self.inner.remove_request(slot)

    def propose(self, inputs: Sequence[ProposeInput]) -> list[Proposal]:
        for item in inputs:
            if list(map(int, item.tokens)) != self.context.get(item.slot):
                self._violation(f"request {item.request_index}: the context at propose is not prompt + accepted tokens")
        proposals = self.inner.propose(inputs)
        if not isinstance(proposals, list) or len(proposals) != len(inputs):
            self._violation(f"propose returned {type(proposals).__name__} for {len(inputs)} inputs; expected a list of as many Proposals")
            return proposals
        for item, proposal in zip(inputs, proposals):
            self._check_proposal(item, proposal)
        return proposals

    def _check_proposal(self, item: ProposeInput, proposal: Proposal) -> None:
        where = f"request {item.request_index} at context length {len(item.tokens)}"
        if not isinstance(proposal, Proposal):
            self._violation(f"{where}: got {type(proposal).__name__}, not a Proposal")
            return
        tokens = np.asarray(proposal.tokens)
        if tokens.ndim != 1 or (len(tokens) and not np.issubdtype(tokens.dtype, np.integer)):
            self._violation(f"{where}: proposal tokens must be a 1-D integer array, got {tokens.dtype} {tokens.shape}")
            return
        if len(tokens) > item.k_max:
            self._violation(f"{where}: proposed {len(tokens)} tokens where k_max was {item.k_max}")
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            self._violation(f"{where}: proposed a token outside the vocabulary 0..{self.vocab_size - 1}")
        if proposal.probs is not None and np.shape(proposal.probs) != (len(tokens), self.vocab_size):
            self._violation(f"{where}: probs has shape {np.shape(proposal.probs)}, expected ({len(tokens)}, {self.vocab_size})")
        if any(int(t) in self.eos_ids for t in tokens[:-1]):
            self.recording.eos_inside_drafts += 1
        self.recording.proposals[(item.request_index, len(item.tokens))] = [int(t) for t in tokens]

    def close(self) -> None:
        self.inner.close()


class AlternatingK(KPolicy):
    """Every other step K = 0 (when compiled), else the smallest K covering the proposals:
    proposals are thrown away unverified, as a K policy may do at any step."""

    name = ALTERNATING

    def __init__(self) -> None:
        self.calls = 0

    def choose_k(self, proposal_counts, compiled_ks):
        self.calls += 1
        if self.calls % 2 == 0 and 0 in compiled_ks:
            return 0
        need = max(proposal_counts, default=0)
        return next((k for k in compiled_ks if k >= need), compiled_ks[-1])


class ConformancePlugin:
    """Registers the checked proposer (the proposer under test, wrapped) and AlternatingK."""

    __name__ = "conformance"

    def __init__(self, registration, recording: Recording):
        self.registration = registration
        self.recording = recording

    @hookimpl
    def spdflow_register_proposers(self, register):
        def factory(config, ctx):
            inner = self.registration.factory(config, ctx)
            return ContractChecker(inner, ctx.target.vocab_size, ctx.target.eos_token_ids, self.recording)

        factory.target_outputs = getattr(self.registration.factory, "target_outputs", ())
        register(CHECKED, factory, config=self.registration.config, description="the proposer under test, checked")

    @hookimpl
    def spdflow_register_k_policies(self, register):
        register(ALTERNATING, AlternatingK, description="K = 0 every other step")


# ------------------------------------------------------------------------------ running


@dataclass
class ScenarioRun:
    """The outcome of one scenario: the engine's state (or its error) and the recording."""

    scenario: Scenario
    state: Any
    error: SpdflowError | None
    recording: Recording

    def steps(self) -> list[dict]:
        return [r for r in (self.state.records if self.state else []) if r.get("kind") == "step"]


def run_scenario(proposer: str, config: dict, scenario: Scenario, model_dir: Path, work_dir: Path,
                 plugins: Sequence[Any] = ()) -> ScenarioRun:
    """Run one scenario through the real engine with the proposer wrapped in a checker."""
    pm = fixtures.fresh_plugin_manager(*plugins)
    recording = Recording()
    pm.add_plugin(ConformancePlugin(pm.lookup("proposer", proposer), recording), "conformance")
    sampled = scenario.sampling is not None
    recipe = fixtures.tiny_recipe(
        model_dir, work_dir / "run", proposer={"uses": CHECKED, "with": config}, k_list=scenario.k_list,
        batch_size=scenario.batch_size, full_batch_size=scenario.full_batch_size,
        prompts=[fixtures.CODE_PROMPTS[i % len(fixtures.CODE_PROMPTS)] for i in range(scenario.prompts)],
        max_new_tokens=scenario.max_new_tokens or MAX_NEW_TOKENS, k_policy=scenario.k_policy, name="conformance")
    if sampled:
        temperature, top_k = scenario.sampling
        recipe["workload"].update(temperature=temperature, top_k=top_k, ignore_eos=True, count=scenario.prompts)
    recipe["acceptance"] = scenario.acceptance
    path = fixtures.write_recipe(work_dir / f"{scenario.id}.yaml", recipe)
    try:
        # sampled runs skip the no-spec comparison: identity is not expected there
        state, error = fixtures.run_in_process(pm, path, check_lossless=not sampled), None
    except SpdflowError as exc:
        state, error = None, exc
    return ScenarioRun(scenario, state, error, recording)


class RunStore:
    """Runs each (proposer, config, scenario, model) once per test session."""

    def __init__(self, work_dir: Path):
        self.work_dir = work_dir
        self.runs: dict[tuple, ScenarioRun] = {}

    def get(self, proposer: str, config: dict, scenario: Scenario, model_dirs: dict[str, Path],
            plugins: Sequence[Any] = ()) -> ScenarioRun:
        # The model is part of the key: two classes may run one proposer on different models.
        key = (proposer, json.dumps(config, sort_keys=True, default=str), scenario.id, tuple(map(id, plugins)),
               str(model_dirs[scenario.model]))
        if key not in self.runs:
            # One output dir for every run: exports and compiled programs are shared (cached).
            self.runs[key] = run_scenario(proposer, config, scenario, model_dirs[scenario.model], self.work_dir, plugins)
        return self.runs[key]


@dataclass
class Conformance:
    """What a conformance test works with: the proposer's registration and its runs."""

    proposer: str
    config: dict
    store: RunStore
    model_dirs: dict[str, Path]
    plugins: Sequence[Any] = ()

    def run(self, scenario_id: str) -> ScenarioRun:
        scenario = next(s for s in (*SCENARIOS, SAMPLED) if s.id == scenario_id)
        return self.store.get(self.proposer, self.config, scenario, self.model_dirs, self.plugins)

    def registration(self):
        return fixtures.fresh_plugin_manager(*self.plugins).lookup("proposer", self.proposer)


def _assert_ran(run: ScenarioRun) -> None:
    if run.error is not None:
        hint = f" ({run.error.hint})" if run.error.hint else ""
        pytest.fail(f"scenario {run.scenario.id} failed: {run.error.message}{hint}", pytrace=False)


# ------------------------------------------------------------------------------ the suite


class ProposerConformance:
    """Subclass with ``proposer = "<registered name>"`` and ``config = {...}`` (its ``with:``).

    ``deterministic = False`` for proposers whose proposals depend on more than the context
    (random draws): the K = 0 comparison is then skipped. ``expects_proposals = False`` for
    proposers that may legitimately never propose on the suite's code prompts. ``plugins`` are
    registered in-process, for plugins that are not installed.
    """

    proposer: str = ""
    config: dict = {}
    deterministic: bool = True
    expects_proposals: bool = True
    plugins: tuple = ()

    @pytest.fixture
    def proposer_config(self) -> dict:
        """The proposer's ``with:`` block; override this fixture when it needs fixture paths."""
        return dict(self.config)

    @pytest.fixture
    def conformance(self, proposer_config, spdflow_conformance_store, tiny_model_dir, tiny_eos_model_dir):
        if not self.proposer:
            pytest.fail("set `proposer = \"<name>\"` on the ProposerConformance subclass", pytrace=False)
        return Conformance(self.proposer, proposer_config, spdflow_conformance_store,
                           {"tiny": tiny_model_dir, "eos": tiny_eos_model_dir}, self.plugins)

    # -- config -----------------------------------------------------------------------------

    def test_config_round_trips_through_the_schema(self, conformance):
        config_model = conformance.registration().config
        assert config_model is not None, f"proposer '{self.proposer}' registered no config model"
        parsed = config_model.model_validate(conformance.config)
        dumped = parsed.model_dump(mode="json")
        assert config_model.model_validate(dumped) == parsed
        jsonschema = pytest.importorskip("jsonschema")
        jsonschema.validate(dumped, config_model.model_json_schema())

    def test_config_appears_in_the_recipe_schema(self, conformance):
        from spdflow.recipe.jsonschema import recipe_json_schema

        schema = recipe_json_schema(fixtures.fresh_plugin_manager(*conformance.plugins))
        assert f"proposer_{self.proposer}_config" in schema["$defs"]

    def test_config_forbids_unknown_keys(self, conformance):
        from pydantic import ValidationError

        config_model = conformance.registration().config
        with pytest.raises(ValidationError):
            config_model.model_validate({**conformance.config, "no_such_setting_xyz": 1})

    def test_config_fields_are_described(self, conformance):
        fields = conformance.registration().config.model_fields
        undocumented = [name for name, info in fields.items() if not info.description]
        assert not undocumented, f"fields without Field(description=...): {undocumented}"

    # -- generation -------------------------------------------------------------------------

    @pytest.mark.parametrize("scenario", SCENARIO_IDS)
    def test_greedy_output_matches_nospec(self, conformance, scenario):
        run = conformance.run(scenario)
        _assert_ran(run)
        lossless = run.state.lossless
        assert lossless["identical"], f"requests {lossless['mismatched_requests']} differ from no-spec decoding"

    @pytest.mark.parametrize("scenario", SCENARIO_IDS)
    def test_follows_the_proposer_contract(self, conformance, scenario):
        run = conformance.run(scenario)
        _assert_ran(run)
        assert not run.recording.violations, "\n".join(run.recording.violations[:20])
        assert not run.recording.open_slots, f"slots never removed: {sorted(run.recording.open_slots)}"

    def test_proposes_on_repetitive_code(self, conformance):
        if not self.expects_proposals:
            pytest.skip("expects_proposals = False")
        run = conformance.run("batch1-K0,4")
        _assert_ran(run)
        assert any(run.recording.proposals.values()), "the proposer never proposed a token"

    def test_k0_steps_keep_proposals_in_sync(self, conformance):
        """A step at K = 0 verifies nothing; afterwards the proposer must propose exactly what it
        would have without that step (its state follows the accepted tokens, not its drafts)."""
        alternating = conformance.run("batch1-K0,4-alternating")
        _assert_ran(alternating)
        assert any(s["k"] == 0 for s in alternating.steps()), "the alternating run had no K = 0 step"
        if not self.deterministic:
            return  # random draws differ run to run; sync was checked by the recording above
        plain = conformance.run("batch1-K0,4")
        _assert_ran(plain)
        shared = sorted(set(plain.recording.proposals) & set(alternating.recording.proposals))
        assert shared, "no context was proposed for in both runs"
        differ = [key for key in shared if plain.recording.proposals[key] != alternating.recording.proposals[key]]
        assert not differ, (
            f"{len(differ)} of {len(shared)} proposals changed after K = 0 steps, first at "
            f"(request, context length) {differ[0]}: {plain.recording.proposals[differ[0]]} vs "
            f"{alternating.recording.proposals[differ[0]]}")

    def test_sampling_reproduces_the_target_distribution(self, conformance):
        """At T > 0 speculation must not change what is sampled: the generated tokens are a
        sample of the target's distribution (rejection sampling with the proposer's drafts, and
        its draft probabilities if it gives any)."""
        run = conformance.run(SAMPLED.id)
        _assert_ran(run)
        assert not run.recording.violations, "\n".join(run.recording.violations[:20])
        fit = sampled_fit(run, conformance.model_dirs["tiny"])
        assert fit.pvalue > SAMPLED_P_MIN, (
            f"the sampled tokens do not fit the target's distribution (PIT chi-squared p = {fit.pvalue:.2g} over "
            f"{fit.tokens} tokens, {fit.outside} outside the top-k, {fit.accepted_drafts} drafted tokens accepted)")

    def test_eos_inside_accepted_tokens_stops_the_request(self, conformance):
        run = conformance.run("eos-batch1-K1,2,4,7")
        _assert_ran(run)
        eos = set(_eos_ids(conformance.model_dirs["eos"]))
        stopped = [o for o in run.state.outputs if o["stop_reason"] == "eos"]
        assert stopped, "no request stopped at EOS; the EOS model should make that certain"
        for output in run.state.outputs:
            early = [t for t in output["tokens"][:-1] if t in eos]
            assert not early, f"request {output['request']} kept generating after EOS {early[0]}"
        assert run.state.lossless["identical"]


@dataclass
class SampledFit:
    """How the tokens of a sampled run fit the target's distribution."""

    pvalue: float  # chi-squared test of the PIT values for uniformity
    tokens: int  # generated tokens tested
    accepted_drafts: int  # drafted tokens the verify steps kept (0: speculation never mattered)
    outside: int  # generated tokens the target gives probability 0 (top-k): must be 0


def _target_probs(logits: np.ndarray, temperature: float, top_k: int) -> np.ndarray:
    """softmax(logits / T) over the top_k largest logits (ties with the k-th kept), float64, on
    the last axis. Written here, apart from the engine's sampling code, so the check does not
    share its bugs."""
    x = np.asarray(logits, dtype=np.float64) / temperature
    if 0 < top_k < x.shape[-1]:
        kth = np.sort(x, axis=-1)[..., -top_k, None]
        x = np.where(x < kth, -np.inf, x)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def chi2_uniform_pvalue(values: np.ndarray, bins: int) -> float:
    """p-value of Pearson's chi-squared test that ``values`` in [0, 1) are uniform (equal bins)."""
    counts = np.bincount(np.minimum((np.asarray(values) * bins).astype(int), bins - 1), minlength=bins)
    expected = len(values) / bins
    stat = float(((counts - expected) ** 2 / expected).sum())
    df = bins - 1
    try:
        from scipy.stats import chi2

        return float(chi2.sf(stat, df))
    except ImportError:  # Wilson-Hilferty
        import math

        z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
        return 0.5 * math.erfc(z / math.sqrt(2))


def sampled_fit(run: ScenarioRun, model_dir: Path, seed: int = 0) -> SampledFit:
    """Whether the tokens of a sampled run are a sample of the target's distribution.

    The target's conditional distribution of every generated token given its context is
    computed with torch (transformers) from ``model_dir`` at the run's temperature and top-k.
    Each token's randomized probability integral transform, with the vocabulary ranked from
    most to least likely, ``u = P(tokens ranked before x) + v * p(x)`` with ``v ~ U(0, 1)``, is
    uniform on [0, 1) and independent of the others exactly when every token was drawn from its
    conditional distribution (Rosenblatt), whatever the proposals and however many were
    accepted. A sampler that keeps drafts too often (a wrong acceptance rule, or a proposer
    that misstates its draft probabilities) puts too many tokens at the top ranks.
    """
    import torch
    from transformers import AutoModelForCausalLM

    temperature, top_k = run.scenario.sampling
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    rng = np.random.default_rng(seed)
    pits, outside = [], 0
    for output in run.state.outputs:
        prompt, tokens = list(output["prompt_tokens"]), list(output["tokens"])
        if not tokens:
            continue
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:len(prompt) - 1 + len(tokens)]
        probs = _target_probs(logits.numpy(), temperature, top_k)
        for p, token in zip(probs, tokens):
            if p[token] <= 0:
                outside += 1
                continue
            order = np.argsort(-p, kind="stable")
            rank = int(np.flatnonzero(order == token)[0])
            pits.append(float(p[order[:rank]].sum()) + rng.random() * float(p[token]))
    pvalue = chi2_uniform_pvalue(np.array(pits), PIT_BINS) if not outside else 0.0
    accepted = sum(row["accepted"] for step in run.steps() for row in step["rows"])
    return SampledFit(pvalue, len(pits) + outside, accepted, outside)


def _eos_ids(model_dir: Path) -> list[int]:
    data = json.loads((Path(model_dir) / "generation_config.json").read_text())
    eos = data.get("eos_token_id")
    return eos if isinstance(eos, list) else [eos]
