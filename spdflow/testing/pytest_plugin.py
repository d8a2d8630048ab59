"""pytest plugin for spdflow and its plugin authors (the ``pytest11`` entry point ``spdflow``).

Fixtures:

* ``spdflow_pm`` — a fresh plugin manager with every installed plugin (one per test).
* ``tiny_model_dir`` — a tiny random-init Llama with the zoo tokenizer (session-scoped).
* ``tiny_draft_model_dir`` — a second one (another seed), for draft-model proposers.
* ``tiny_eos_model_dir`` — ``tiny_model_dir`` with one id in eight as EOS, so requests stop
  early, often inside a draft.
* ``tiny_program`` — ``tiny_model_dir`` exported and compiled for onnxruntime by the real
  engine (K-list [0, 4]); ``tiny_program.open_session()`` opens a session on it.
* ``spdflow_workdir`` — the session's shared directory: exports and compiled programs in it
  are reused by every test of the session.

Only fixture definitions live here: importing this module must stay cheap because pytest loads
it in every project that has spdflow installed.
"""
from __future__ import annotations

import pytest

from spdflow.testing import fixtures


@pytest.fixture
def spdflow_pm():
    """A fresh plugin manager with every installed plugin loaded."""
    return fixtures.fresh_plugin_manager()


@pytest.fixture(scope="session")
def spdflow_workdir(tmp_path_factory):
    """One directory per test session for exports, compiled programs and conformance runs."""
    return tmp_path_factory.mktemp("spdflow")


@pytest.fixture(scope="session")
def tiny_model_dir(spdflow_workdir):
    """A tiny random-init Llama (2 layers, hidden 64, vocab 4096, zoo tokenizer)."""
    from spdflow.testing.models import make_tiny_model

    return make_tiny_model(spdflow_workdir / "models" / "tiny-llama", arch="llama", seed=0)


@pytest.fixture(scope="session")
def tiny_draft_model_dir(spdflow_workdir):
    """A second tiny Llama with the same tokenizer, for draft-model proposers."""
    from spdflow.testing.models import make_tiny_model

    return make_tiny_model(spdflow_workdir / "models" / "tiny-llama-draft", arch="llama", seed=1)


@pytest.fixture(scope="session")
def tiny_eos_model_dir(spdflow_workdir, tiny_model_dir):
    """``tiny_model_dir`` where every id = 3 (mod 8) is an EOS token."""
    return fixtures.make_eos_variant(tiny_model_dir, spdflow_workdir / "models" / "tiny-llama-eos", range(3, 4096, 8))


@pytest.fixture(scope="session")
def tiny_program(spdflow_workdir, tiny_model_dir):
    """``tiny_model_dir`` exported and compiled for onnxruntime through the real engine."""
    program = fixtures.build_tiny_program(tiny_model_dir, spdflow_workdir / "program")
    yield program
    program.close()


@pytest.fixture(scope="session")
def spdflow_conformance_store(spdflow_workdir):
    """Caches conformance runs across the tests of a session (see spdflow.testing.conformance)."""
    from spdflow.testing.conformance import RunStore

    return RunStore(spdflow_workdir / "conformance")
