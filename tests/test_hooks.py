"""One test per hook (``test_hook_<name>``), each around the example shown in docs/hooks.md.

The code between ``# -- start <hook> --`` and ``# -- end <hook> --`` is copied verbatim into
docs/hooks.md; tests/test_docs.py fails when the two drift apart. The meta-test at the bottom
fails when a hook has no ``test_hook_<name>`` test anywhere in tests/.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from spdflow import hookspecs
from spdflow.api import AcceptRow, ExportResult, ModelInfo, Proposal, ProposeInput, Sampling
from spdflow.testing import fixtures

TESTS = Path(__file__).parent
HOOK_NAMES = sorted(name for name in dir(hookspecs) if name.startswith("spdflow_"))

# -- start spdflow_register_proposers --
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from spdflow import hookimpl
from spdflow.api import Proposal, Proposer


class RepeatConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    times: int = Field(2, ge=1, description="How often to repeat the anchor token.")


class RepeatProposer(Proposer):
    """Proposes the anchor token again: right whenever the text stutters."""

    def __init__(self, config: RepeatConfig):
        self.times = config.times

    def propose(self, inputs):
        return [Proposal(np.repeat(item.tokens[-1:], min(self.times, item.k_max))) for item in inputs]


@hookimpl
def spdflow_register_proposers(register):
    register("repeat", lambda config, ctx: RepeatProposer(config), config=RepeatConfig,
             description="Repeat the last token.")
# -- end spdflow_register_proposers --


class RepeatPlugin:
    spdflow_register_proposers = staticmethod(spdflow_register_proposers)


def test_hook_spdflow_register_proposers(spdflow_pm):
    spdflow_pm.add_plugin(RepeatPlugin(), "repeat")
    registration = spdflow_pm.lookup("proposer", "repeat")
    proposer = registration.factory(registration.config(times=3), None)
    [proposal] = proposer.propose([ProposeInput(0, 0, np.array([5, 7]), 1, 2)])
    assert registration.plugin == "repeat" and proposal.tokens.tolist() == [7, 7]


# -- start spdflow_register_backends --
from spdflow import hookimpl
from spdflow.api import Backend


class NowhereBackend(Backend):
    name = "nowhere"

    def unavailable_reason(self):
        return "the nowhere runtime is not installed"


@hookimpl
def spdflow_register_backends(register):
    register("nowhere", NowhereBackend, description="A backend that never runs.")
# -- end spdflow_register_backends --


class BackendPlugin:
    spdflow_register_backends = staticmethod(spdflow_register_backends)


def test_hook_spdflow_register_backends(spdflow_pm):
    spdflow_pm.add_plugin(BackendPlugin(), "nowhere")
    backend = spdflow_pm.lookup("backend", "nowhere").factory()
    assert backend.unavailable_reason() == "the nowhere runtime is not installed"


# -- start spdflow_register_k_policies --
from spdflow import hookimpl
from spdflow.api import KPolicy


class LargestK(KPolicy):
    """Always verify with the largest compiled K."""

    name = "largest"

    def choose_k(self, proposal_counts, compiled_ks):
        return max(compiled_ks)


@hookimpl
def spdflow_register_k_policies(register):
    register("largest", LargestK, description="Always the largest K.")
# -- end spdflow_register_k_policies --


class KPolicyPlugin:
    spdflow_register_k_policies = staticmethod(spdflow_register_k_policies)


def test_hook_spdflow_register_k_policies(spdflow_pm):
    spdflow_pm.add_plugin(KPolicyPlugin(), "largest")
    assert spdflow_pm.lookup("k_policy", "largest").factory().choose_k([1, 0], [0, 2, 4]) == 4


# -- start spdflow_register_acceptors --
import numpy as np

from spdflow import hookimpl
from spdflow.api import Acceptor


class RejectAll(Acceptor):
    """Keeps no proposal, only the target's own greedy token: no-spec output, spec cost."""

    name = "reject_all"

    def accept(self, logits, rows, sampling):
        return [np.array([int(np.argmax(logits[i, 0]))]) for i in range(len(rows))]


@hookimpl
def spdflow_register_acceptors(register):
    register("reject_all", RejectAll, description="Accept nothing.")
# -- end spdflow_register_acceptors --


class AcceptorPlugin:
    spdflow_register_acceptors = staticmethod(spdflow_register_acceptors)


def test_hook_spdflow_register_acceptors(spdflow_pm):
    spdflow_pm.add_plugin(AcceptorPlugin(), "reject_all")
    acceptor = spdflow_pm.lookup("acceptor", "reject_all").factory()
    logits = np.zeros((1, 3, 8), dtype=np.float32)
    logits[0, 0, 5] = 1.0
    rows = [AcceptRow(0, Proposal(np.array([5, 6])), np.random.default_rng(0))]
    assert [r.tolist() for r in acceptor.accept(logits, rows, Sampling())] == [[5]]


# -- start spdflow_register_workloads --
from spdflow import hookimpl


def greetings(count, seed):
    names = ["ada", "grace", "alan", "edsger"]
    return [f"def greet_{names[(seed + i) % len(names)]}():" for i in range(count)]


@hookimpl
def spdflow_register_workloads(register):
    register("greetings", greetings, description="Tiny function headers.")
# -- end spdflow_register_workloads --


class WorkloadPlugin:
    spdflow_register_workloads = staticmethod(spdflow_register_workloads)


def test_hook_spdflow_register_workloads(spdflow_pm):
    spdflow_pm.add_plugin(WorkloadPlugin(), "greetings")
    factory = spdflow_pm.lookup("workload", "greetings").factory
    assert factory(2, 1) == ["def greet_grace():", "def greet_alan():"]
    assert factory(2, 1) == factory(2, 1)


# -- start spdflow_register_cost_models --
from pydantic import BaseModel, ConfigDict, Field

from spdflow import hookimpl
from spdflow.api import CostModel


class FlatConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step_ms: float = Field(30.0, gt=0, description="Milliseconds of every verify run.")
    per_token_ms: float = Field(0.5, ge=0, description="Extra milliseconds per verified position.")


class FlatCost(CostModel):
    """A device whose verify time grows linearly with the positions it verifies."""

    name = "flat"

    def __init__(self, config: FlatConfig):
        self.config = config

    def verify_s(self, batch, k):
        return (self.config.step_ms + self.config.per_token_ms * batch * (k + 1)) / 1000

    def describe(self):
        return {"cost_model": "flat", "source": "a guess, for the example"}


@hookimpl
def spdflow_register_cost_models(register):
    register("flat", lambda config, ctx: FlatCost(config), config=FlatConfig,
             description="Linear verify time per verified position.")
# -- end spdflow_register_cost_models --


class CostModelPlugin:
    spdflow_register_cost_models = staticmethod(spdflow_register_cost_models)


def test_hook_spdflow_register_cost_models(spdflow_pm):
    spdflow_pm.add_plugin(CostModelPlugin(), "flat")
    registration = spdflow_pm.lookup("cost_model", "flat")
    model = registration.factory(registration.config(step_ms=10.0, per_token_ms=1.0), None)
    assert registration.plugin == "flat"
    assert model.verify_s(2, 3) == pytest.approx(0.018) and model.switch_s(2) == 0.0
    assert model.prefill_s(1, 32) is None


# -- start spdflow_export --
from spdflow import hookimpl


class ExportLog:
    """Prints which model each export is for, then lets the export plugin do the work."""

    def __init__(self):
        self.roles = []

    @hookimpl(wrapper=True)
    def spdflow_export(self, request):
        self.roles.append(request.role)
        return (yield)
# -- end spdflow_export --


def test_hook_spdflow_export(spdflow_pm, tmp_path):
    log = ExportLog()

    class FakeExport:  # stands in for the ONNX exporter: no torch in this test
        @hookimpl
        def spdflow_export(self, request):
            info = ModelInfo("m", "llama", 8, 1, 1, 4, (0,), 1, tmp_path, None)
            return ExportResult(request.work_dir / "model.onnx", info)

    spdflow_pm.add_plugin(FakeExport(), "fake_export")
    spdflow_pm.add_plugin(log, "export_log")
    request = type("Request", (), {"role": "draft", "work_dir": tmp_path})()
    result = spdflow_pm.hook.spdflow_export(request=request)
    assert log.roles == ["draft"] and result.onnx_path == tmp_path / "model.onnx"


# -- start spdflow_specialize --
from spdflow import hookimpl


class NoBigK:
    """Refuses K-lists with a K above 16 before anything is compiled."""

    @hookimpl(wrapper=True)
    def spdflow_specialize(self, num_speculative_tokens, prefill_seq_len, ctx_len, batch_size, full_batch_size):
        if max(num_speculative_tokens) > 16:
            raise ValueError("this device supports K <= 16")
        return (yield)
# -- end spdflow_specialize --


def test_hook_spdflow_specialize(spdflow_pm):
    spdflow_pm.add_plugin(NoBigK(), "no_big_k")
    call = dict(prefill_seq_len=32, ctx_len=128, batch_size=1, full_batch_size=None,
                comp_ctx_lengths=None, comp_ctx_lengths_prefill=None)
    shapes = spdflow_pm.hook.spdflow_specialize(num_speculative_tokens=[0, 4], **call)
    assert [s.kind for s in shapes] == ["prefill", "decode", "decode"]
    assert [s.seq_len for s in shapes] == [32, 1, 5]
    with pytest.raises(ValueError, match="K <= 16"):
        spdflow_pm.hook.spdflow_specialize(num_speculative_tokens=[0, 32], **call)


# -- start spdflow_compile --
import time

from spdflow import hookimpl


class CompileTimer:
    """Measures every compile, whichever backend runs it."""

    def __init__(self):
        self.seconds = {}

    @hookimpl(wrapper=True)
    def spdflow_compile(self, request, backend):
        start = time.perf_counter()
        program = yield
        self.seconds[request.role] = time.perf_counter() - start
        return program
# -- end spdflow_compile --


def test_hook_spdflow_compile(spdflow_pm):
    timer = CompileTimer()
    spdflow_pm.add_plugin(timer, "compile_timer")

    class FakeBackend:
        def compile(self, request):
            return "program"

    request = type("Request", (), {"role": "target"})()
    assert spdflow_pm.hook.spdflow_compile(request=request, backend=FakeBackend()) == "program"
    assert set(timer.seconds) == {"target"}


# -- start spdflow_propose --
from spdflow import hookimpl


class ProposalSizes:
    """Records how many tokens the proposer offered per request and step."""

    def __init__(self):
        self.sizes = []

    @hookimpl(wrapper=True)
    def spdflow_propose(self, proposer, inputs):
        proposals = yield
        self.sizes.append([len(p.tokens) for p in proposals])
        return proposals
# -- end spdflow_propose --


def test_hook_spdflow_propose(spdflow_pm):
    sizes = ProposalSizes()
    spdflow_pm.add_plugin(sizes, "sizes")
    inputs = [ProposeInput(0, 0, np.array([3, 4]), 1, 3), ProposeInput(1, 1, np.array([5]), 1, 1)]
    proposals = spdflow_pm.hook.spdflow_propose(proposer=RepeatProposer(RepeatConfig(times=2)), inputs=inputs)
    assert sizes.sizes == [[2, 1]] and proposals[0].tokens.tolist() == [4, 4]


# -- start spdflow_verify --
from spdflow import hookimpl


class VerifyCounter:
    """Counts target runs by the number of logits kept (1: prefill, K+1: decode)."""

    def __init__(self):
        self.runs = {}

    @hookimpl(wrapper=True)
    def spdflow_verify(self, session, input_ids, position_ids, num_logits_to_keep, batch_index):
        self.runs[num_logits_to_keep] = self.runs.get(num_logits_to_keep, 0) + 1
        return (yield)
# -- end spdflow_verify --


def test_hook_spdflow_verify(spdflow_pm):
    counter = VerifyCounter()
    spdflow_pm.add_plugin(counter, "verify_counter")

    class FakeSession:
        def run(self, input_ids, position_ids, num_logits_to_keep, batch_index=None):
            return np.zeros((len(input_ids), num_logits_to_keep, 8), dtype=np.float32)

    ids = np.zeros((1, 5), dtype=np.int64)
    logits = spdflow_pm.hook.spdflow_verify(session=FakeSession(), input_ids=ids, position_ids=ids,
                                            num_logits_to_keep=5, batch_index=None)
    assert logits.shape == (1, 5, 8) and counter.runs == {5: 1}


# -- start spdflow_accept --
from spdflow import hookimpl


class AcceptedLengths:
    """Collects accepted lengths per step (tokens appended minus the target's own one)."""

    def __init__(self):
        self.lengths = []

    @hookimpl(wrapper=True)
    def spdflow_accept(self, acceptor, logits, rows, sampling):
        tokens = yield
        self.lengths += [len(t) - 1 for t in tokens]
        return tokens
# -- end spdflow_accept --


def test_hook_spdflow_accept(spdflow_pm):
    lengths = AcceptedLengths()
    spdflow_pm.add_plugin(lengths, "lengths")
    logits = np.zeros((1, 3, 8), dtype=np.float32)
    logits[0, 0, 5] = logits[0, 1, 6] = logits[0, 2, 2] = 1.0
    rows = [AcceptRow(0, Proposal(np.array([5, 7])), np.random.default_rng(0))]
    acceptor = spdflow_pm.lookup("acceptor", "greedy").factory()
    tokens = spdflow_pm.hook.spdflow_accept(acceptor=acceptor, logits=logits, rows=rows, sampling=Sampling())
    assert tokens[0].tolist() == [5, 6] and lengths.lengths == [1]


# -- start spdflow_before_run --
from spdflow import hookimpl


class RunJournal:
    """Writes one line per run start, stage end and run end into the run directory."""

    def __init__(self):
        self.lines = []

    @hookimpl
    def spdflow_before_run(self, recipe, run):
        self.lines.append(f"start {recipe.name} in {run.run_dir}")
# -- end spdflow_before_run --

    # -- start spdflow_after_stage --
    @hookimpl
    def spdflow_after_stage(self, stage, run):
        self.lines.append(f"{stage.name}: {stage.status} ({stage.reason})")
    # -- end spdflow_after_stage --

    # -- start spdflow_after_run --
    @hookimpl
    def spdflow_after_run(self, recipe, run):
        self.lines.append(f"end {recipe.name}: {run.status}")
        (run.run_dir / "journal.txt").write_text("\n".join(self.lines) + "\n")
    # -- end spdflow_after_run --


@pytest.fixture(scope="module")
def journal_run(tiny_model_dir, spdflow_workdir):
    """One real (no-spec, tiny) run with the journal plugin."""
    pm = fixtures.fresh_plugin_manager()
    journal = RunJournal()
    pm.add_plugin(journal, "journal")
    recipe = fixtures.tiny_recipe(tiny_model_dir, spdflow_workdir / "hooks-run", k_list=(0,), max_new_tokens=4)
    state = fixtures.run_in_process(pm, fixtures.write_recipe(spdflow_workdir / "hooks.yaml", recipe))
    return journal, state


def test_hook_spdflow_before_run(journal_run):
    journal, state = journal_run
    assert journal.lines[0] == f"start tiny in {state.run_dir}"


def test_hook_spdflow_after_stage(journal_run):
    journal, _ = journal_run
    stages = [line.split(":")[0] for line in journal.lines[1:-1]]
    assert stages[:4] == ["export", "specialize", "compile", "generate"]


def test_hook_spdflow_after_run(journal_run):
    journal, state = journal_run
    assert "end tiny: ok" in journal.lines  # after_run comes before the report stage
    assert (state.run_dir / "journal.txt").read_text().splitlines()[0].startswith("start tiny")


# ------------------------------------------------------------------------------ meta-test


def _test_names() -> set[str]:
    names = set()
    for path in TESTS.rglob("test_*.py"):
        names |= set(re.findall(r"^\s*(?:async\s+)?def (test_hook_\w+)", path.read_text(), flags=re.M))
    return names


@pytest.mark.parametrize("hook", HOOK_NAMES)
def test_every_hook_has_a_test(hook):
    names = _test_names()
    assert any(name == f"test_hook_{hook}" or name.startswith(f"test_hook_{hook}_") for name in names), (
        f"no test named test_hook_{hook} in tests/; every hook needs at least one")
