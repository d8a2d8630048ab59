"""Fixtures of spdflow-rest's tests; spdflow's own (tiny models, conformance) come from its
pytest plugin, loaded automatically when spdflow is installed."""
from __future__ import annotations

import pytest

from spdflow.testing import fixtures


@pytest.fixture(scope="session")
def outputs_corpus(spdflow_workdir, tiny_model_dir):
    """A corpus of what the tiny model writes for the suite's prompts (no-spec, greedy): REST
    then drafts real continuations, which the target accepts, rejects or cuts at EOS."""
    corpus = spdflow_workdir / "rest-corpus"
    if not corpus.is_dir():
        recipe = fixtures.tiny_recipe(tiny_model_dir, spdflow_workdir / "conformance" / "run",
                                      prompts=fixtures.CODE_PROMPTS, k_list=(0,), max_new_tokens=48,
                                      name="rest-corpus")
        state = fixtures.run_in_process(fixtures.fresh_plugin_manager(), fixtures.write_recipe(
            spdflow_workdir / "rest-corpus.yaml", recipe), check_lossless=False)
        corpus.mkdir()
        for output in state.outputs:
            (corpus / f"output_{output['request']}.txt").write_text(output["prompt"] + output["output"])
    return corpus
