"""The default implementations of the protocol hooks, registered in every plugin manager.

They only dispatch to the object the engine resolved from the recipe (backend, proposer,
acceptor); plugins override a stage by returning a result first or wrap it with
``@hookimpl(wrapper=True)``.
"""
from __future__ import annotations

from spdflow.hookspecs import hookimpl


@hookimpl(trylast=True)
def spdflow_compile(request, backend):
    return backend.compile(request)


@hookimpl(trylast=True)
def spdflow_propose(proposer, inputs):
    return proposer.propose(inputs)


@hookimpl(trylast=True)
def spdflow_verify(session, input_ids, position_ids, num_logits_to_keep, batch_index):
    return session.run(input_ids, position_ids, num_logits_to_keep, batch_index)


@hookimpl(trylast=True)
def spdflow_accept(acceptor, logits, rows, sampling):
    return acceptor.accept(logits, rows, sampling)
