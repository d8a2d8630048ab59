"""Every spdflow hook. No logic lives here.

Three kinds of hook:

* registration — ``spdflow_register_<things>(register)``: called once per plugin manager, each
  plugin calls ``register(...)`` for every named implementation it provides. Return value is
  ignored.
* protocol — ``firstresult``: the stage hooks export, specialize, compile, propose, verify and
  accept. The built-in plugins implement each at ``trylast``, so a plugin may take over a stage
  (return a result) or wrap it (``@hookimpl(wrapper=True)``) for timing or tracing. Stops at the
  first non-None result.
* lifecycle — ``spdflow_before_*`` / ``spdflow_after_*``: notifications. Return value is ignored.

Hooks are always called with keyword arguments. Arguments may be added in later versions, never
removed; an implementation may accept any subset of them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from spdflow.api import (
        AcceptRow,
        Acceptor,
        CompiledProgram,
        CompileRequest,
        ExportRequest,
        ExportResult,
        Proposal,
        ProposeInput,
        Proposer,
        Sampling,
        Session,
        RunState,
        Specialization,
        StageResult,
    )
    from spdflow.recipe.schema import Recipe

hookspec = pluggy.HookspecMarker("spdflow")
hookimpl = pluggy.HookimplMarker("spdflow")

# ------------------------------------------------------------------------------- registration


@hookspec
def spdflow_register_proposers(register: Callable[..., None]) -> None:
    """Register proposers (the ``proposer.uses`` names of a recipe).

    Called once when the plugin manager's registry is first built.

    :param register: ``register(name, factory, config=ConfigModel, description="", aliases=())``.
        ``aliases`` are other names a recipe may use (e.g. vLLM's ``ngram``). ``factory(config, ctx)`` gets the validated ``with:`` block (an instance of ``config``,
        a pydantic model with ``extra="forbid"``) and a :class:`spdflow.api.ProposerContext`,
        and returns a :class:`spdflow.api.Proposer`. It is only called when a run starts.

    Return value is ignored.
    """


@hookspec
def spdflow_register_backends(register: Callable[..., None]) -> None:
    """Register backends (the ``devices.backend`` names of a recipe).

    Called once when the plugin manager's registry is first built.

    :param register: ``register(name, factory, config=ConfigModel, description="")``;
        ``factory()`` returns a :class:`spdflow.api.Backend`. ``config`` (optional, a pydantic
        model with ``extra="forbid"``) validates the recipe's ``devices.with:`` block; the
        instance reaches the backend as ``CompileRequest.backend_config``. Import heavy
        runtimes inside the factory or later, never at plugin import time: lint loads every
        plugin.

    Return value is ignored.
    """


@hookspec
def spdflow_register_k_policies(register: Callable[..., None]) -> None:
    """Register K policies (the recipe's ``k_policy`` names).

    Called once when the plugin manager's registry is first built.

    :param register: ``register(name, factory, config=ConfigModel, description="")``;
        ``factory(config)`` gets the validated ``k_policy.with:`` block (an instance of
        ``config``) when a config model is given, else ``factory()`` is called; it returns a
        :class:`spdflow.api.KPolicy`.

    Return value is ignored.
    """


@hookspec
def spdflow_register_acceptors(register: Callable[..., None]) -> None:
    """Register acceptance methods (the recipe's ``acceptance`` names).

    Called once when the plugin manager's registry is first built.

    :param register: ``register(name, factory, description="")``; ``factory()`` returns a
        :class:`spdflow.api.Acceptor`. Its ``lossless_at`` ("zero", "positive", "any") says at
        which temperatures it keeps the output distribution: ``acceptance: auto`` picks from those,
        and naming one at a temperature it does not keep is SPD037.

    Return value is ignored.
    """


@hookspec
def spdflow_register_workloads(register: Callable[..., None]) -> None:
    """Register named prompt sets (the recipe's ``workload.builtin`` names).

    Called once when the plugin manager's registry is first built.

    :param register: ``register(name, factory, description="")``; ``factory(count, seed)``
        returns a list of prompt strings, deterministically, without network access.

    Return value is ignored.
    """


@hookspec
def spdflow_register_cost_models(register: Callable[..., None]) -> None:
    """Register cost models (the ``--cost`` names of ``spdflow whatif`` and ``spdflow advise``).

    Called once when the plugin manager's registry is first built.

    :param register: ``register(name, factory, config=ConfigModel, description="")``.
        ``factory(config, ctx)`` gets the validated ``--cost-with`` settings (an instance of
        ``config``, a pydantic model with ``extra="forbid"``; None when there is no model) and a
        :class:`spdflow.api.CostContext` (the run being priced), and returns a
        :class:`spdflow.api.CostModel`.

    Return value is ignored.
    """


# ------------------------------------------------------------------------------- protocol


@hookspec(firstresult=True)
def spdflow_export(request: "ExportRequest") -> "ExportResult | None":
    """Export one Hugging Face causal LM to the ONNX contract of DESIGN §4.

    Called by the engine's export stage when its cache key changed, once per model (the target,
    and the draft of a draft-model proposer), with the model already resolved to a local
    directory. Write only inside ``request.work_dir``; the engine moves it into place.
    ``request.graph`` other than ``"causal_lm"`` asks for another graph built from the model
    directory (``"eagle_layer"``: the EAGLE layer of the ``eagle`` proposer); an implementation
    that does not build it returns None.

    :param request: the model, its local directory, the role and the temp work dir.
    :return: an :class:`spdflow.api.ExportResult`. Stops at first non-None result.
    """


@hookspec(firstresult=True)
def spdflow_specialize(
    num_speculative_tokens: "list[int]",
    prefill_seq_len: int,
    ctx_len: int,
    batch_size: int,
    full_batch_size: "int | None",
    comp_ctx_lengths: "list[int] | None",
    comp_ctx_lengths_prefill: "list[int] | None",
) -> "list[Specialization] | None":
    """Turn a K-list and shape settings into the compiled shapes.

    A pure function of its arguments, called for every model before compile, by ``lint`` (shape
    coverage) and by ``run --dry-run``.

    :param num_speculative_tokens: the K-list as the recipe gave it (an int means ``[K]``).
    :param prefill_seq_len: tokens per prefill chunk.
    :param ctx_len: KV cache length.
    :param batch_size: requests per prefill (and per decode step without continuous batching).
    :param full_batch_size: KV slots under continuous batching, else None.
    :param comp_ctx_lengths: the backend's compute context lengths (``devices.with``), None
        without CCL; every shape then exists once per CCL (``Specialization.comp_ctx_lengths``).
        An implementation that does not take these two arguments compiles no CCL shapes.
    :param comp_ctx_lengths_prefill: the prefill's own CCLs, None to use ``comp_ctx_lengths``.
    :return: prefill first, then one decode shape per distinct K ascending. Stops at first
        non-None result.
    """


@hookspec(firstresult=True)
def spdflow_compile(request: "CompileRequest", backend: "Any") -> "CompiledProgram | None":
    """Compile one exported model for one backend.

    Called by the engine's compile stage, once per model. The default implementation calls
    ``backend.compile(request)``; the backend owns its cache (the ``qpc-<hash>`` directory).
    Runs that share a cache dir (the points of a sweep) may ask for one program at once, so a
    backend builds under ``spdflow.engine.cache.build_lock(qpc_dir)`` and checks for a finished
    program inside it (the built-in backends do).

    :param request: the ONNX, its specializations, the devices section, the K-list.
    :param backend: the :class:`spdflow.api.Backend` named by ``devices.backend``.
    :return: a :class:`spdflow.api.CompiledProgram`. Stops at first non-None result.
    """


@hookspec(firstresult=True)
def spdflow_propose(
    proposer: "Proposer", inputs: "list[ProposeInput]"
) -> "list[Proposal] | None":
    """Ask the proposer for draft tokens for every active request of one decode step.

    Called once per decode step, before K is chosen; not called by ``nospec`` runs.

    :param proposer: the run's proposer instance.
    :param inputs: one :class:`spdflow.api.ProposeInput` per active request.
    :return: one :class:`spdflow.api.Proposal` per input, each at most ``k_max`` tokens.
        Stops at first non-None result.
    """


@hookspec(firstresult=True)
def spdflow_verify(
    session: "Session",
    input_ids: "np.ndarray",
    position_ids: "np.ndarray",
    num_logits_to_keep: int,
    batch_index: "np.ndarray | None",
) -> "np.ndarray | None":
    """Run the target on one step's anchor + K proposals (seq_len = K+1).

    Called once per decode step after K is chosen, and once per prefill chunk.

    :param session: the target's backend session.
    :param input_ids: int64 [batch, K+1]; padding ids are a valid token, never -1.
    :param position_ids: int64 [batch, K+1], anchor_pos + 0..K, -1 on unused slots.
    :param num_logits_to_keep: K+1 for decode, 1 for prefill.
    :param batch_index: int64 [batch, 1] under continuous batching, else None.
    :return: logits float32 [batch, num_logits_to_keep, vocab]. Stops at first non-None result.
    """


@hookspec(firstresult=True)
def spdflow_accept(
    acceptor: "Acceptor", logits: "np.ndarray", rows: "list[AcceptRow]", sampling: "Sampling"
) -> "list[np.ndarray] | None":
    """Decide which proposed tokens each request keeps, plus one token from the target.

    Called once per decode step, after verify.

    :param acceptor: the run's acceptance method.
    :param logits: float32 [batch, K+1, vocab] from verify.
    :param rows: one :class:`spdflow.api.AcceptRow` per batch row.
    :param sampling: temperature, top_k, top_p of the workload.
    :return: per row, int64 tokens to append (1 to len(proposal)+1). Stops at first non-None
        result.
    """


# ------------------------------------------------------------------------------- lifecycle


@hookspec
def spdflow_before_run(recipe: "Recipe", run: "RunState") -> None:
    """Called once when ``spdflow run`` (or one bench mode) starts, after the recipe validated.

    :param recipe: the validated recipe.
    :param run: the run's mutable state (run dir, stage results so far).

    Return value is ignored.
    """


@hookspec
def spdflow_after_stage(stage: "StageResult", run: "RunState") -> None:
    """Called after each stage (export, specialize, compile, generate, report) ends, whether it
    ran, was cached, or failed.

    :param stage: the stage's result: name, status, reason, duration, cache key.
    :param run: the run's mutable state.

    Return value is ignored.
    """


@hookspec
def spdflow_after_run(recipe: "Recipe", run: "RunState") -> None:
    """Called once when a run ends, successfully or not, before the report is written.

    :param recipe: the validated recipe.
    :param run: the run's state; ``run.status`` is "ok", "failed" or "interrupted".

    Return value is ignored.
    """
