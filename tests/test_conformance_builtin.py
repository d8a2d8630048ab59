"""The built-in proposers pass the conformance suite every third-party proposer runs."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from spdflow.api import Proposal
from spdflow.hookspecs import hookimpl
from spdflow.testing.conformance import SAMPLED, ProposerConformance, run_scenario, sampled_fit
from spdflow.testing.fixtures import fresh_plugin_manager
from tests.plugins.test_acceptance import AlwaysAccept as WrongAlwaysAccept


class TestPromptLookup(ProposerConformance):
    proposer = "prompt_lookup"
    config = {"prompt_lookup_min": 1, "prompt_lookup_max": 3}
    # A random-init model rarely repeats a token of its own context within 40 tokens.
    expects_proposals = False


class TestSuffix(ProposerConformance):
    proposer = "suffix"
    config = {"max_depth": 16}


class TestSynthetic(ProposerConformance):
    proposer = "synthetic"
    config = {"acceptance_rate": 0.7, "seed": 1}
    deterministic = False  # draws from a random stream per step


class TestDraftModel(ProposerConformance):
    proposer = "draft_model"

    @pytest.fixture
    def proposer_config(self, tiny_draft_model_dir):
        return {"model": str(tiny_draft_model_dir)}


class TestMultiProjection(ProposerConformance):
    proposer = "multi_projection"

    @pytest.fixture
    def tiny_model_dir(self, tiny_speculator_model_dir):
        return tiny_speculator_model_dir

    @pytest.fixture
    def tiny_eos_model_dir(self, tiny_speculator_eos_model_dir):
        return tiny_speculator_eos_model_dir


class TestEagle(TestMultiProjection):
    proposer = "eagle"


class TestMultiProjectionEmbedded(ProposerConformance):
    """The trained heads the embedded target ships (the tiny random ones above rarely land)."""

    proposer = "multi_projection"

    @pytest.fixture
    def tiny_model_dir(self, embedded_target_dir):
        return embedded_target_dir

    @pytest.fixture
    def tiny_eos_model_dir(self, embedded_target_eos_dir):
        return embedded_target_eos_dir

    def test_trained_proposals_are_accepted(self, conformance):
        """The shipped weights load and help: some verified proposals of the embedded model are
        accepted (an untrained or mis-loaded speculator almost never lands a token)."""
        run = conformance.run("batch1-K3")
        accepted = [row["accepted"] for step in run.steps() for row in step["rows"]]
        assert sum(accepted) >= max(1, len(accepted) // 20), f"{sum(accepted)} tokens accepted in {len(accepted)} rows"


class TestEagleEmbedded(TestMultiProjectionEmbedded):
    """The trained EAGLE layer the embedded target ships."""

    proposer = "eagle"


# ------------------------------------------------- the sampled check can fail

class AlwaysAccept(WrongAlwaysAccept):
    """A deliberately wrong acceptor (keeps every draft, then samples one more), registered by name."""

    name = "conformance_always_accept"


class BrokenPlugin:
    """Registers AlwaysAccept and ``lying_<proposer>``: the proposer claiming its drafts were
    sampled from a uniform distribution (they are its argmax: point masses)."""

    __name__ = "conformance_broken"

    def __init__(self, proposer: str):
        self.proposer = proposer

    @hookimpl
    def spdflow_register_acceptors(self, register):
        register(AlwaysAccept.name, AlwaysAccept, description="keeps every draft (wrong on purpose)")

    @hookimpl
    def spdflow_register_proposers(self, register):
        inner = fresh_plugin_manager().lookup("proposer", self.proposer)

        def factory(config, ctx):
            proposer = inner.factory(config, ctx)
            honest = proposer.propose
            vocab = ctx.target.vocab_size

            def propose(inputs):
                return [Proposal(p.tokens, np.full((len(p.tokens), vocab), 1.0 / vocab, dtype=np.float32))
                        for p in honest(inputs)]

            proposer.propose = propose
            return proposer

        factory.target_outputs = getattr(inner.factory, "target_outputs", ())
        register(f"lying_{self.proposer}", factory, config=inner.config, description="lies about its q")


@pytest.mark.parametrize(("proposer", "fault"), [("multi_projection", "always-accept"), ("eagle", "lying-q")])
def test_the_sampled_check_catches_a_wrong_acceptor_or_draft_distribution(proposer, fault, embedded_target_dir,
                                                                          tmp_path):
    """The same scenario and fit as the suite's sampled test, with a fault injected: it must
    fail. (Each fault fails it for both proposers, p < 1e-14 when measured; two cases keep the
    suite short.)"""
    plugin = BrokenPlugin(proposer)
    if fault == "always-accept":
        name, scenario = proposer, dataclasses.replace(SAMPLED, acceptance=AlwaysAccept.name)
    else:
        name, scenario = f"lying_{proposer}", SAMPLED
    run = run_scenario(name, {}, scenario, embedded_target_dir, tmp_path, plugins=(plugin,))
    assert run.error is None, run.error
    fit = sampled_fit(run, embedded_target_dir)
    assert fit.accepted_drafts > 0
    assert fit.pvalue < 1e-6, f"{fault}: p = {fit.pvalue:.2g} ({fit.accepted_drafts} drafts accepted)"
