"""spdflow-rest passes spdflow's proposer conformance suite: two lines and a corpus."""
from __future__ import annotations

import pytest

from spdflow.testing.conformance import ProposerConformance


class TestRestConformance(ProposerConformance):
    proposer = "rest"

    @pytest.fixture
    def proposer_config(self, outputs_corpus):
        return {"corpus": str(outputs_corpus), "glob": "*.txt", "min_suffix_len": 1}
