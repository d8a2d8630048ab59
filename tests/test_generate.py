"""The SpD loop end to end on the ONNX Runtime backend: lossless for every proposer, batch
mode and K-list; stopping rules; a proposer that raises."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from spdflow.api import Proposal
from spdflow.engine.run import Engine, RunOptions
from spdflow.errors import PluginError
from spdflow.recipe.loader import load_recipe

PROMPTS = [
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n",
    "import os\nimport sys\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
    "for i in range(10):\n    print(i)\n",
    "x = [1, 2, 3]\ny = [",
]

PROPOSERS = {
    "prompt_lookup": {"prompt_lookup_min": 1, "prompt_lookup_max": 3},
    "suffix": {},
    "synthetic": {"acceptance_rate": 0.6, "proposal_rate": 0.8, "seed": 1},
    "draft_model": {"model": "DRAFT"},
}
BATCHING = {
    "batch1": {"batch_size": 1},
    "batch3": {"batch_size": 3},
    "cb2": {"batch_size": 1, "full_batch_size": 2},
}
K_LISTS = {"k3": 3, "k0_4": [0, 4], "k1247": [1, 2, 4, 7]}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from spdflow.testing.models import make_tiny_model

    root = tmp_path_factory.mktemp("models")
    return make_tiny_model(root / "target", seed=0), make_tiny_model(root / "draft", seed=1, num_layers=1)


@pytest.fixture(scope="module")
def out_root(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


def write(tmp_path, target, out, proposer=None, config=None, ks=(0, 4), batching=None, max_new=20, extra=""):
    lines = ["version: 1", "name: gen", f"model: {{id: {json.dumps(str(target))}}}",
             f"num_speculative_tokens: {json.dumps(ks)}", f"output: {json.dumps(str(out))}",
             f"specialization: {json.dumps({'prefill_seq_len': 16, 'ctx_len': 128, **(batching or {})})}",
             f"workload: {json.dumps({'prompts': PROMPTS, 'max_new_tokens': max_new, 'ignore_eos': True})}"]
    if proposer:
        lines.append(f"proposer: {json.dumps({'uses': proposer, 'with': config or {}})}")
    path = tmp_path / "recipe.yaml"
    path.write_text("\n".join(lines) + extra + "\n")
    return path


def run(pm, path, **options):
    engine = Engine(pm, load_recipe(path, pm, allow_outside_paths=True), RunOptions(**options))  # models elsewhere
    return engine.run()


@pytest.mark.parametrize("ks", list(K_LISTS.values()), ids=list(K_LISTS))
@pytest.mark.parametrize("batching", list(BATCHING.values()), ids=list(BATCHING))
@pytest.mark.parametrize("proposer", list(PROPOSERS))
def test_greedy_spd_is_token_identical_to_nospec(pm, tmp_path, models, out_root, proposer, batching, ks):
    target, draft = models
    config = {k: (str(draft) if v == "DRAFT" else v) for k, v in PROPOSERS[proposer].items()}
    path = write(tmp_path, target, out_root / f"{proposer}", proposer, config, ks, batching)
    state = run(pm, path, check_lossless=True)
    assert state.lossless["identical"], state.lossless
    steps = [r for r in state.records if r["kind"] == "step"]
    compiled = sorted({ks} if isinstance(ks, int) else set(ks))
    assert {s["k"] for s in steps} <= set(compiled)
    assert all(len(o["tokens"]) == 20 for o in state.outputs)


def test_speculation_actually_happens(pm, tmp_path, models, out_root):
    target, _ = models
    path = write(tmp_path, target, out_root / "spec", "synthetic", {"acceptance_rate": 1.0, "proposal_rate": 1.0}, [0, 4])
    state = run(pm, path)
    rows = [row for r in state.records if r["kind"] == "step" for row in r["rows"]]
    assert sum(row["accepted"] for row in rows) > len(rows)  # well above one per step
    runtime = state.stages["generate"].detail["runtime"]  # what the session really ran with
    assert runtime["threads_effective"] >= 1 and runtime["execution_provider"] == "cpu"
    report = json.loads((state.run_dir / "report.json").read_text())
    assert next(s for s in report["stages"] if s["name"] == "generate")["detail"]["runtime"] == runtime


def test_max_new_tokens_inside_accepted_draft_stops_exactly(pm, tmp_path, models, out_root):
    target, _ = models
    for max_new in (1, 2, 7):
        path = write(tmp_path, target, out_root / "stop", "synthetic", {"acceptance_rate": 1.0, "proposal_rate": 1.0},
                     [0, 4], max_new=max_new)
        state = run(pm, path, check_lossless=True)
        assert state.lossless["identical"]
        assert all(len(o["tokens"]) == max_new and o["stop_reason"] == "max_new_tokens" for o in state.outputs)


def test_ctx_len_stops_cleanly_with_a_reason(pm, tmp_path, models, out_root):
    target, _ = models
    path = write(tmp_path, target, out_root / "ctx", "prompt_lookup", {}, [0, 4], max_new=126)
    state = run(pm, path, check_lossless=True)
    assert state.lossless["identical"]
    for output, prompt in zip(state.outputs, PROMPTS):
        assert output["stop_reason"] == "ctx_len"


def test_proposer_raising_mid_run_names_the_plugin_and_marks_the_report_failed(pm, tmp_path, models, out_root):
    from spdflow import hookimpl
    from spdflow.api import Proposer

    class Flaky(Proposer):
        calls = 0

        def propose(self, inputs):
            Flaky.calls += 1
            if Flaky.calls > 3:
                raise ValueError("index out of range")
            return [self.empty() for _ in inputs]

        empty = staticmethod(lambda: __import__("spdflow.api", fromlist=["Proposal"]).Proposal.empty())

    class Plugin:
        @hookimpl
        def spdflow_register_proposers(self, register):
            register("flaky", lambda config, ctx: Flaky())

    pm.add_plugin(Plugin(), "flaky-plugin", version="9.9")
    out = out_root / "flaky"
    path = write(tmp_path, target=models[0], out=out, proposer="flaky")
    with pytest.raises(PluginError) as info:
        run(pm, path)
    assert "proposer 'flaky'" in info.value.message and "index out of range" in info.value.message
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "failed" and report["error"]["stage"] == "generate"


@pytest.mark.parametrize("batching", list(BATCHING.values()), ids=list(BATCHING))
@pytest.mark.parametrize("proposer", list(PROPOSERS))
def test_embedded_model_is_lossless_and_speculates(pm, tmp_path, out_root, proposer, batching):
    """The trained embedded model repeats itself, so every proposer really proposes here."""
    config = {k: ("spdflow:tinycode-draft" if v == "DRAFT" else v) for k, v in PROPOSERS[proposer].items()}
    path = write(tmp_path, "spdflow:tinycode-target", out_root / f"embedded-{proposer}", proposer, config,
                 [0, 2, 4, 7], batching, max_new=32)
    state = run(pm, path, check_lossless=True)
    assert state.lossless["identical"], state.lossless
    rows = [row for r in state.records if r["kind"] == "step" for row in r["rows"]]
    assert sum(row["proposed"] for row in rows) > 0 and sum(row["accepted"] for row in rows) > 0


# ------------------------------------------------------------------------- K policies that learn


@pytest.mark.parametrize("batching", [BATCHING["batch3"], BATCHING["cb2"]], ids=["batch3", "cb2"])
@pytest.mark.parametrize("proposer", list(PROPOSERS))
def test_goodput_policy_is_lossless_for_every_proposer(pm, tmp_path, out_root, proposer, batching):
    """goodput skips proposing, truncates proposals and switches K: the tokens must not change."""
    config = {k: ("spdflow:tinycode-draft" if v == "DRAFT" else v) for k, v in PROPOSERS[proposer].items()}
    path = write(tmp_path, "spdflow:tinycode-target", out_root / f"goodput-{proposer}", proposer, config,
                 [0, 2, 4, 7], batching, max_new=48, extra="\nk_policy: goodput")
    state = run(pm, path, check_lossless=True)
    assert state.lossless["identical"], state.lossless
    costs = [r for r in state.records if r["kind"] == "step_costs"]
    assert len(costs) == 1 and set(costs[0]["verify_s"]) == {"0", "2", "4", "7"}


class Recording:
    """A K policy that records what the engine tells it and proposes nothing every other step."""

    name = "recording"

    def __init__(self):
        self.calls = []
        self.budgets = []

    def start(self, compiled_ks, rows, services):
        self.calls.append(("start", list(compiled_ks), rows, services.step_costs()))
        self.services = services

    def propose_budget(self, k_max, step):
        self.calls.append(("budget", k_max, step))
        self.budgets.append(0 if len(self.budgets) % 2 else k_max)
        return self.budgets[-1]

    def choose_k(self, proposal_counts, compiled_ks):
        self.calls.append(("choose", list(proposal_counts)))
        return max(compiled_ks) if any(proposal_counts) else 0

    def observe(self, outcome):
        self.calls.append(("observe", outcome))


def register_policy(pm, policy):
    from spdflow.hookspecs import hookimpl

    class Plugin:
        @hookimpl
        def spdflow_register_k_policies(self, register):
            register(policy.name, lambda: policy)

    pm.add_plugin(Plugin(), f"{policy.name}-plugin", version="1.0")


def test_the_engine_drives_the_k_policy_lifecycle(pm, tmp_path, models, out_root):
    policy = Recording()
    register_policy(pm, policy)
    calls_to_propose = []
    path = write(tmp_path, models[0], out_root / "lifecycle", "synthetic",
                 {"acceptance_rate": 1.0, "proposal_rate": 1.0}, [0, 4], extra="\nk_policy: recording")
    import spdflow_proposers.synthetic as synthetic

    original = synthetic.SyntheticProposer.propose

    def spy(self, inputs):
        calls_to_propose.append([item.k_max for item in inputs])
        return original(self, inputs)

    import spdflow.oracle

    run_oracle = spdflow.oracle.run_oracle

    def after_generation(*args, **kwargs):  # the oracle's own proposer pass is not the generation's
        synthetic.SyntheticProposer.propose = original
        return run_oracle(*args, **kwargs)

    synthetic.SyntheticProposer.propose = spy
    spdflow.oracle.run_oracle = after_generation
    try:
        state = run(pm, path, check_lossless=True)
    finally:
        synthetic.SyntheticProposer.propose = original
        spdflow.oracle.run_oracle = run_oracle
    assert state.lossless["identical"]
    kinds = [c[0] for c in policy.calls]
    assert kinds[0] == "start" and policy.calls[0][1] == [0, 4] and set(policy.calls[0][3]) == {0, 4}
    steps = [r for r in state.records if r["kind"] == "step"]
    assert kinds.count("budget") == kinds.count("choose") == kinds.count("observe") == len(steps)
    # Budget 0 (every other step) means the proposer is not called at all.
    asked = sum(1 for b in policy.budgets if b)
    assert 0 < asked < len(policy.budgets)
    # Steps near a request's end have no room to propose (k_max 0), so some asked steps skip too.
    assert asked // 2 <= len(calls_to_propose) <= asked
    budget = next(c for c in policy.calls if c[0] == "budget")[2]
    # a static batch admits the next group only when all its rows are done: nothing waits for a slot
    assert budget.waiting == 0 and budget.rows == 1 and budget.tokens_left == (19,) and budget.requests == (0,)
    # each step names the request on each row, in the order of tokens_left
    contexts = [c[2] for c in policy.calls if c[0] == "budget"]
    assert all(len(c.requests) == len(c.tokens_left) for c in contexts)
    assert sorted({c.requests for c in contexts}) == [(i,) for i in range(len(PROMPTS))]
    observed = [c[1] for c in policy.calls if c[0] == "observe"]
    assert {o.k for o in observed} == {0, 4}
    assert all(o.verify_s > 0 and len(o.proposed) == len(o.accepted) == 1 for o in observed)
    assert all(o.propose_s == 0.0 for o in observed if o.k == 0)
    # it asked for step costs (measured once, traced) but not for scoring
    assert [r["kind"] for r in state.records].count("step_costs") == 1
    assert all(o.scored == () for o in observed)


def test_only_continuous_batching_has_requests_waiting_for_a_slot(pm, tmp_path, models, out_root):
    policy = Recording()
    register_policy(pm, policy)
    path = write(tmp_path, models[0], out_root / "waiting-cb", "synthetic",
                 {"acceptance_rate": 1.0, "proposal_rate": 1.0}, [0, 4], BATCHING["cb2"], extra="\nk_policy: recording")
    run(pm, path)
    waiting = [c[2].waiting for c in policy.calls if c[0] == "budget"]
    assert waiting[0] == len(PROMPTS) - 2 and waiting[-1] == 0 and sorted(waiting, reverse=True) == waiting


class Scoring(Recording):
    """Verifies at K=2 or not at all (K=0) in turn, and keeps what the engine scored."""

    name = "scoring"

    def __init__(self):
        super().__init__()
        self.scored = []
        self.scored_by = []  # (request, (checked, matched))
        self.turn = 0

    def start(self, compiled_ks, rows, services):
        services.score_proposals()

    def propose_budget(self, k_max, step):
        return k_max

    def choose_k(self, proposal_counts, compiled_ks):
        self.turn += 1
        return 2 if any(proposal_counts) and self.turn % 2 else 0

    def observe(self, outcome):
        assert len(outcome.scored_requests) == len(outcome.scored)
        self.scored.extend(outcome.scored)
        self.scored_by.extend(zip(outcome.scored_requests, outcome.scored))


def test_every_proposal_is_scored_against_the_tokens_that_follow_it(pm, tmp_path, models, out_root):
    policy = Scoring()
    register_policy(pm, policy)
    path = write(tmp_path, models[0], out_root / "scoring", "synthetic",
                 {"acceptance_rate": 0.6, "proposal_rate": 0.8}, [0, 2, 4], extra="\nk_policy: scoring")
    import spdflow_proposers.synthetic as synthetic

    cls = synthetic.SyntheticProposer
    saved = {name: getattr(cls, name) for name in ("add_request", "on_accepted", "propose", "remove_request")}
    live, final, proposals = {}, {}, []

    def add_request(self, slot, request):
        live[slot] = (request.index, list(request.prompt_ids))
        saved["add_request"](self, slot, request)

    def on_accepted(self, slot, tokens):
        live[slot][1].extend(int(t) for t in tokens)
        saved["on_accepted"](self, slot, tokens)

    def propose(self, inputs):
        out = saved["propose"](self, inputs)
        proposals.extend((item.request_index, len(item.tokens), [int(t) for t in p.tokens])
                         for item, p in zip(inputs, out) if len(p.tokens))
        return out

    def remove_request(self, slot):
        if slot in live:
            index, tokens = live.pop(slot)
            final[index] = tokens
        saved["remove_request"](self, slot)

    import spdflow.oracle

    run_oracle = spdflow.oracle.run_oracle

    def after_generation(*args, **kwargs):  # the oracle's own proposer pass is not the generation's
        for name, fn in saved.items():
            setattr(cls, name, fn)
        return run_oracle(*args, **kwargs)

    for name, fn in [("add_request", add_request), ("on_accepted", on_accepted), ("propose", propose),
                     ("remove_request", remove_request)]:
        setattr(cls, name, fn)
    spdflow.oracle.run_oracle = after_generation
    try:
        state = run(pm, path, check_lossless=True)
    finally:
        for name, fn in saved.items():
            setattr(cls, name, fn)
        spdflow.oracle.run_oracle = run_oracle
    assert state.lossless["identical"]
    expected, expected_by = [], []
    for index, start, tokens in proposals:
        sequence = final[index]
        seen = min(len(tokens), len(sequence) - start)
        matched = 0
        while matched < seen and sequence[start + matched] == tokens[matched]:
            matched += 1
        if matched < seen:
            expected.append((matched + 1, matched))
        elif matched:
            expected.append((matched, matched))
        else:
            continue
        expected_by.append((index, expected[-1]))
    # Cut (K=2 of up to 4) and unverified (K=0) proposals are scored as fully as verified ones,
    # each named with the request that made it.
    assert sorted(policy.scored) == sorted(expected)
    assert sorted(policy.scored_by) == sorted(expected_by) and len({i for i, _ in expected_by}) > 1
    assert any(checked > 2 for checked, _ in policy.scored)  # beyond what K=2 verified
    assert {matched for _, matched in policy.scored} >= {0, 1, 2}


class Grading(Scoring):
    """Scoring, and reads the proposals' grades (it overrides ``see_grades``)."""

    name = "grading"

    def __init__(self):
        super().__init__()
        self.seen = []  # each step's grades, as see_grades got them
        self.scored_grades = []  # (request, grade) of each scored proposal
        self.chosen = 0

    def see_grades(self, grades):
        self.seen.append(list(grades))

    def choose_k(self, proposal_counts, compiled_ks):
        self.chosen += 1
        assert len(self.seen) == self.chosen  # see_grades came first
        return super().choose_k(proposal_counts, compiled_ks)

    def observe(self, outcome):
        super().observe(outcome)
        assert len(outcome.scored_grades) == len(outcome.scored)
        self.scored_grades.extend(zip(outcome.scored_requests, outcome.scored_grades))


def test_a_policy_that_reads_grades_gets_each_rows_and_each_scored_proposals(pm, tmp_path, models, out_root):
    policy = Grading()
    register_policy(pm, policy)
    path = write(tmp_path, models[0], out_root / "grades", "prompt_lookup", {}, [0, 2, 4],
                 BATCHING["batch3"], max_new=40, extra="\nk_policy: grading")
    import spdflow_proposers.prompt_lookup as prompt_lookup

    cls = prompt_lookup.PromptLookupProposer
    original, made = cls.propose, []

    def propose(self, inputs):
        out = original(self, inputs)
        made.append([(item.request_index, p.grade, len(p.tokens)) for item, p in zip(inputs, out)])
        return out

    import spdflow.oracle

    run_oracle = spdflow.oracle.run_oracle

    def after_generation(*args, **kwargs):  # the oracle's own proposer pass is not the generation's
        cls.propose = original
        return run_oracle(*args, **kwargs)

    cls.propose, spdflow.oracle.run_oracle = propose, after_generation
    try:
        state = run(pm, path, check_lossless=True)
    finally:
        cls.propose, spdflow.oracle.run_oracle = original, run_oracle
    assert state.lossless["identical"]
    # see_grades ran before every choose_k, with each row's grade (steps without a proposer call: all None)
    assert len(policy.seen) == policy.chosen
    graded_steps = [[grade for _, grade, _ in step] for step in made]
    def some(steps):
        return [s for s in steps if any(g is not None for g in s)]

    assert some(graded_steps) == some(policy.seen)
    graded = [(r, g) for step in made for r, g, n in step if n]
    assert graded and all(g in (1, 2, 3) for _, g in graded)  # prompt lookup: the matched n-gram's length
    assert all(g is None for step in made for _, g, n in step if not n)
    # each scored proposal carries the grade its proposal had (ones that matched nothing at a
    # request's end are not scored, so the scored ones are a sub-multiset)
    assert policy.scored_grades and not Counter(policy.scored_grades) - Counter(graded)


def test_a_proposal_grade_that_is_not_an_int_is_refused(pm, tmp_path, models, out_root):
    import spdflow_proposers.prompt_lookup as prompt_lookup

    cls = prompt_lookup.PromptLookupProposer
    original = cls.propose

    def propose(self, inputs):
        return [Proposal(p.tokens, grade=0.5) for p in original(self, inputs)]

    path = write(tmp_path, models[0], out_root / "bad-grade", "prompt_lookup", {}, [0, 2], max_new=40)
    cls.propose = propose
    try:
        with pytest.raises(PluginError, match="grade of 0.5 for request .*must be an int or None"):
            run(pm, path)
    finally:
        cls.propose = original


def test_a_k_policy_that_breaks_is_named_in_one_sentence(pm, tmp_path, models, out_root):
    class Broken(Recording):
        name = "broken"

        def propose_budget(self, k_max, step):
            return k_max + 5

    register_policy(pm, Broken())
    path = write(tmp_path, models[0], out_root / "broken-policy", "prompt_lookup", {}, [0, 4],
                 extra="\nk_policy: broken")
    with pytest.raises(PluginError, match="propose_budget returned 9; it must be an int in 0..4"):
        run(pm, path)


def test_step_costs_touch_only_the_reserved_kv_slot_and_are_measured_once(pm, tmp_path, models, out_root):
    import numpy as np

    from spdflow.engine.generate import StepCosts

    path = write(tmp_path, models[0], out_root / "costs", "prompt_lookup", {}, [0, 2])
    engine = Engine(pm, load_recipe(path, pm, allow_outside_paths=True), RunOptions())
    program, info = engine.build_model(engine.recipe.model, "target", [0, 2], engine.recipe.devices)
    session = engine.open_session(program)
    try:
        rng = np.random.default_rng(0)
        for array in session.kv_cache().values():
            array[...] = rng.standard_normal(array.shape)
        before = {name: array.copy() for name, array in session.kv_cache().items()}
        owned = StepCosts()
        costs = owned.get(pm, session, 1, [0, 2], info.pad_token_id)
        assert set(costs) == {0, 2} and all(v > 0 for v in costs.values())
        for name, array in session.kv_cache().items():
            assert np.array_equal(array[:, :, :-1], before[name][:, :, :-1]), name
        calls = []
        original = pm.hook.spdflow_verify
        pm.hook.spdflow_verify = lambda **kw: calls.append(kw) or original(**kw)
        try:
            assert owned.get(pm, session, 1, [0, 2], info.pad_token_id) == costs
            assert calls == []  # kept per session by their owner
            assert StepCosts().get(pm, session, 1, [0, 2], info.pad_token_id).keys() == costs.keys()
            assert calls  # another owner (another run) measures for itself: no module-level cache
        finally:
            pm.hook.spdflow_verify = original
    finally:
        session.close()


# ------------------------------------------------------------------------ plugins cannot corrupt output


def _register(pm, kind: str, name: str, factory, plugin: str) -> None:
    from spdflow import hookimpl

    hook = {"proposer": "spdflow_register_proposers", "acceptor": "spdflow_register_acceptors"}[kind]

    class Plugin:
        pass

    setattr(Plugin, hook, staticmethod(hookimpl(specname=hook)(lambda register: register(name, factory))))
    pm.add_plugin(Plugin(), plugin, version="0.1")


class _Writer:
    """A proposer that writes into what the engine hands it (the tokens, the request, the accepted tokens)."""

    def __init__(self, where: str):
        from spdflow.api import Proposer

        self.where = where
        self.base = Proposer

    def add_request(self, slot, request):
        if self.where == "request":
            request.prompt_ids[0] = 7

    def propose(self, inputs):
        from spdflow.api import Proposal

        if self.where == "tokens":
            for item in inputs:
                item.tokens[-1] = 3  # would change the anchor the target verifies
        return [Proposal.empty() for _ in inputs]

    def on_accepted(self, slot, tokens):
        if self.where == "accepted":
            tokens[:] = 5

    def remove_request(self, slot):
        pass

    def close(self):
        pass


def test_step_costs_interleave_the_ks_so_a_burst_of_load_does_not_land_on_one_k():
    """A burst that slows every run for a while (another process on a shared machine) must not
    make one K look several times dearer: the policy starts from these figures and would never
    run that K to learn better."""
    from types import SimpleNamespace

    from spdflow.engine.generate import measure_step_costs

    cost = {0: 1.0, 2: 1.2, 4: 1.4, 7: 1.7}
    clock = SimpleNamespace(now=0.0, calls=0)

    def verify(session, input_ids, position_ids, num_logits_to_keep, batch_index):
        clock.calls += 1
        burst = 10.0 if clock.calls <= 28 else 0.0  # the first 28 runs, a quarter of them all
        clock.now += cost[input_ids.shape[1] - 1] + burst

    pm = SimpleNamespace(hook=SimpleNamespace(spdflow_verify=verify))
    measured = measure_step_costs(pm, None, 1, [0, 2, 4, 7], 0, clock=lambda: clock.now)
    assert measured == pytest.approx(cost)
    assert clock.calls == 4 * 4 * (4 + 3)  # rounds x K x (warm-up + timed runs)


@pytest.mark.parametrize("where", ["tokens", "request", "accepted"])
def test_a_proposer_that_writes_into_engine_state_fails_the_run_naming_it(pm, tmp_path, models, out_root, where):
    _register(pm, "proposer", "writer", lambda config, ctx: _Writer(where), "writer-plugin")
    out = out_root / "writer"
    path = write(tmp_path, models[0], out, "writer", max_new=8)
    with pytest.raises(PluginError) as info:
        run(pm, path)
    assert "proposer 'writer' (plugin 'writer-plugin' 0.1) failed" in info.value.message
    assert "read-only" in info.value.message
    assert info.value.exit_code == 4


def _bad_proposals(case: str, vocab: int):
    from spdflow.api import Proposal

    one = np.array([1], dtype=np.int64)
    return {
        "not a Proposal": {"tokens": one},
        "float ids": Proposal(np.array([1.5])),
        "2-D ids": Proposal(np.array([[1, 2]])),
        "bool ids": Proposal(np.array([True])),
        "negative id": Proposal(np.array([-1])),
        "id past the vocab": Proposal(np.array([vocab])),
        "too many": Proposal(np.arange(1, 9)),
        "NaN probs": Proposal(one, np.full((1, vocab), np.nan, dtype=np.float32)),
        "negative probs": Proposal(one, np.full((1, vocab), -1.0, dtype=np.float32)),
        "probs of the wrong shape": Proposal(one, np.ones((2, vocab), dtype=np.float32)),
        "zero probs": Proposal(one, np.zeros((1, vocab), dtype=np.float32)),
    }[case]


BAD_PROPOSALS = {
    "not a Proposal": "propose() must return Proposal objects",
    "float ids": "integer token ids",
    "2-D ids": "integer token ids",
    "bool ids": "integer token ids",
    "negative id": "outside the vocabulary",
    "id past the vocab": "outside the vocabulary",
    "too many": "where k_max was",
    "NaN probs": "NaN, infinite or negative",
    "negative probs": "NaN, infinite or negative",
    "probs of the wrong shape": "one distribution per proposed token",
    "zero probs": "sums to 0",
}


@pytest.mark.parametrize("case", list(BAD_PROPOSALS))
def test_an_out_of_contract_proposal_is_a_plugin_error_naming_the_plugin(pm, tmp_path, models, out_root, case):
    from spdflow.api import Proposer

    class Bad(Proposer):
        def __init__(self, vocab):
            self.vocab = vocab

        def propose(self, inputs):
            return [_bad_proposals(case, self.vocab) for _ in inputs]

    _register(pm, "proposer", "bad", lambda config, ctx: Bad(ctx.target.vocab_size), "bad-plugin")
    path = write(tmp_path, models[0], out_root / "contract", "bad", ks=[0, 4], max_new=8)
    if "probs" in case:  # draft probabilities are read by sampled acceptance
        path.write_text(path.read_text().replace('"ignore_eos": true', '"ignore_eos": true, "temperature": 0.7'))
    with pytest.raises(PluginError) as info:
        run(pm, path)
    assert "proposer 'bad' (plugin 'bad-plugin' 0.1)" in info.value.message
    assert BAD_PROPOSALS[case] in info.value.message, info.value.message


def test_reference_output_is_read_only(pm, tmp_path, models, out_root):
    from spdflow.api import Proposal, Proposer

    class Peeks(Proposer):
        needs_reference_output = True

        def __init__(self, ctx):
            self.ctx = ctx

        def propose(self, inputs):
            for item in inputs:
                self.ctx.reference_output(item.request_index)[0] = 1
            return [Proposal.empty() for _ in inputs]

    _register(pm, "proposer", "peeks", lambda config, ctx: Peeks(ctx), "peeks-plugin")
    with pytest.raises(PluginError, match="read-only"):
        run(pm, write(tmp_path, models[0], out_root / "peeks", "peeks", max_new=8))


def test_an_acceptor_that_changes_the_output_fails_the_lossless_check_with_exit_5(pm, tmp_path, models, out_root):
    from spdflow.api import Acceptor
    from spdflow.errors import LosslessError
    from spdflow_decoding.acceptance import accept_greedy

    class AcceptsEverything(Acceptor):
        """Keeps every proposed token, then the target's token after them: wrong, but in contract."""

        name = "all_in"

        def accept(self, logits, rows, sampling):
            greedy = accept_greedy(logits, rows)
            return [np.concatenate([row.proposal.tokens, [g[-1] if len(g) == len(row.proposal.tokens) + 1
                                                          else logits[i, len(row.proposal.tokens)].argmax()]])
                    for i, (row, g) in enumerate(zip(rows, greedy))]

    _register(pm, "acceptor", "all_in", lambda: AcceptsEverything(), "all-in-plugin")
    out = out_root / "yes"
    path = write(tmp_path, models[0], out, "prompt_lookup", {"prompt_lookup_min": 1}, extra="\nacceptance: all_in")
    with pytest.raises(LosslessError) as info:
        run(pm, path, check_lossless=True)
    assert info.value.exit_code == 5 and "differs from the greedy no-spec baseline" in info.value.message
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "failed" and report["lossless"]["identical"] is False
    # without --check-lossless nothing compares, so nothing fails (the check is the safety net)
    assert run(pm, path).status == "ok"


def test_an_acceptor_returning_tokens_out_of_contract_is_a_plugin_error(pm, tmp_path, models, out_root):
    from spdflow.api import Acceptor

    class Skips(Acceptor):
        name = "skips"

        def accept(self, logits, rows, sampling):
            return [np.array([], dtype=np.int64) for _ in rows]

    _register(pm, "acceptor", "skips", lambda: Skips(), "skips-plugin")
    path = write(tmp_path, models[0], out_root / "skips", "prompt_lookup", extra="\nacceptance: skips")
    with pytest.raises(PluginError, match="acceptor 'skips' returned"):
        run(pm, path)
