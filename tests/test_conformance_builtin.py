"""The built-in proposers pass the conformance suite every third-party proposer runs."""
from __future__ import annotations

import pytest

from spdflow.testing.conformance import ProposerConformance


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
