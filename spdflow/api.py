"""The objects the engine and plugins exchange.

Everything a plugin implements or receives is defined here, so a plugin author reads one file.
This module imports only numpy and pydantic: lint and schema never pull in an ML framework.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from pydantic import BaseModel

    from spdflow.recipe.schema import DevicesSpec, ModelSpec, Recipe

# --------------------------------------------------------------------------------------------
# shapes

#: The ONNX dynamic-axis symbols, in the order they appear in specializations.json.
#: ``comp_ctx_lengths`` (the compute context length, CCL) is set only on programs compiled with
#: CCLs; QEfficient writes it in this place.
SYMBOL_ORDER = ("batch_size", "seq_len", "ctx_len", "comp_ctx_lengths", "num_logits_to_keep", "full_batch_size")


@dataclass(frozen=True)
class Specialization:
    """One compiled shape: values for the ONNX dynamic-axis symbols.

    ``kind`` is "prefill" or "decode"; ``k`` is the number of speculative tokens a decode
    shape verifies (seq_len = K+1), None for prefill. ``comp_ctx_lengths`` is the compute
    context length: how many KV-cache slots the shape reads (None: all ctx_len of them).
    """

    kind: str
    batch_size: int
    seq_len: int
    ctx_len: int
    num_logits_to_keep: int
    full_batch_size: int | None = None
    k: int | None = None
    comp_ctx_lengths: int | None = None

    def symbols(self) -> dict[str, int]:
        """The symbol -> value mapping, in SYMBOL_ORDER, without unset symbols."""
        values = {name: getattr(self, name) for name in SYMBOL_ORDER}
        return {name: value for name, value in values.items() if value is not None}


# --------------------------------------------------------------------------------------------
# models and export


@dataclass(frozen=True)
class ModelInfo:
    """What the engine needs to know about an exported causal LM."""

    name: str
    model_type: str
    vocab_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    source_dir: Path
    tokenizer_file: Path | None

    def to_json(self) -> dict[str, Any]:
        """The JSON form kept in export done markers and ``model_info.json``."""
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["eos_token_ids"] = list(self.eos_token_ids)
        data["source_dir"] = str(self.source_dir)
        data["tokenizer_file"] = str(self.tokenizer_file) if self.tokenizer_file else None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ModelInfo":
        """The inverse of :meth:`to_json`."""
        return cls(data["name"], data["model_type"], data["vocab_size"], data["num_layers"], data["num_kv_heads"],
                   data["head_dim"], tuple(data["eos_token_ids"]), data["pad_token_id"], Path(data["source_dir"]),
                   Path(data["tokenizer_file"]) if data.get("tokenizer_file") else None)


@dataclass
class ExportRequest:
    """Input of the export stage: turn one HF causal LM into the ONNX of DESIGN §4."""

    model: "ModelSpec"
    model_dir: Path  # already resolved to a local directory
    role: str  # "target" or "draft"
    continuous_batching: bool
    work_dir: Path  # an empty temp dir; the engine renames it into place when the hook returns
    progress: Callable[[str], None] = lambda message: None
    #: extra target outputs the run's proposer asked for (``Proposer.target_outputs``); empty
    #: means the default graph. "head_logits": logits [batch, nlk, heads+1, vocab] from the
    #: model directory's multi-projection heads (row 0 the LM head); "hidden_states": an output
    #: [batch, seq_len, hidden] with the final-norm hidden state of every input row.
    outputs: tuple[str, ...] = ()
    #: True exports the graph with the ``comp_ctx_lengths`` input (compute context lengths,
    #: CCL): its length is how many cache slots a step reads. False: the default graph.
    ccl: bool = False
    #: "causal_lm": the model itself. "eagle_layer": the EAGLE draft layer next to the model
    #: (``eagle_config.json`` + ``eagle.safetensors``, reusing the model's embedding and LM
    #: head), with the extra input ``hidden_states`` [batch, seq_len, hidden] and the extra
    #: output ``hidden_states_out`` [batch, nlk, hidden]; one KV layer.
    graph: str = "causal_lm"


@dataclass
class ExportResult:
    """Output of the export stage. Paths point inside ``ExportRequest.work_dir``."""

    onnx_path: Path
    model_info: ModelInfo
    files: list[Path] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# compile and run


@dataclass
class CompileRequest:
    """Input of the compile stage for one model (target or draft)."""

    onnx_path: Path
    export_dir: Path  # qpc-<hash>/ directories are created here
    specializations: list[Specialization]
    num_speculative_tokens: list[int]  # the sorted, deduplicated K-list
    devices: "DevicesSpec"
    model_info: ModelInfo
    role: str
    continuous_batching: bool
    compile_only: bool = False
    force: bool = False
    progress: Callable[[str], None] = lambda message: None
    #: hash every file of a cached program in full before reusing it (``spdflow run --verify``)
    verify: bool = False
    #: a warning for the user, e.g. that a cached program is damaged and rebuilt
    warn: Callable[[str], None] = lambda message: None
    #: the model's weight dtype (recipe ``model.dtype``): float32 | float16 | bfloat16. QAIC
    #: derives the KV cache precision and -convert-to-fp16 from it.
    dtype: str = "float32"
    #: the backend's validated ``devices.with:`` block (an instance of the config model it
    #: registered), or None when it registered none.
    backend_config: "BaseModel | None" = None


@dataclass
class CompiledProgram:
    """A compiled program directory ``qpc-<hash>/`` and how it came to be."""

    backend: str
    qpc_dir: Path  # the qpc-<hash> directory
    key: str  # the 16 hex digits in its name
    cached: bool
    reason: str
    specializations: list[Specialization]
    model_info: ModelInfo
    command: list[str] | None = None  # the compiler command, where there is one
    runnable: bool = True  # False for --compile-only programs that were not compiled here


class Session(Protocol):
    """A loaded compiled program with its KV cache resident (on device or in host memory).

    ``run`` picks the specialization from the shapes it is given, as qaicrt does. The KV cache
    has ``kv_batch_size`` rows (``full_batch_size`` under continuous batching); a run with
    ``batch_index`` writes and reads only those rows. The returned logits
    ``[batch, num_logits_to_keep, vocab]`` may be a view of a reused buffer: valid until the
    next ``run``.
    """

    kv_batch_size: int
    ctx_len: int
    vocab_size: int
    specializations: list[Specialization]

    def run(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        num_logits_to_keep: int,
        batch_index: np.ndarray | None = None,
    ) -> np.ndarray: ...

    def close(self) -> None: ...

    # Optional: ``outputs() -> dict[str, np.ndarray]``, the extra outputs of the last run
    # (e.g. "hidden_states"), valid until the next run. Logits come from ``run``.
    # Optional: ``runtime_facts() -> dict``, what the session really runs with (e.g. the
    # threads in effect), recorded in the run report's generate stage as ``detail.runtime``.


class Backend:
    """A compile target plus its runtime. Registered by name via spdflow_register_backends."""

    name: str = ""
    version: str = "0"
    #: what one entry of ``devices.device_ids`` is, as a schedulable resource (e.g. "qaic": a
    #: sweep asks Ray for one "qaic" unit per device id); None when the backend runs on host CPUs
    device_resource: str | None = None

    def unavailable_reason(self) -> str | None:
        """None when sessions can be opened here, else one sentence saying what is missing."""
        return None

    def dtype_problem(self, dtype: str, config: Any) -> str | None:
        """None when this backend compiles weights of ``dtype`` ("float32", "float16",
        "bfloat16") with ``config`` (its validated ``devices.with`` block, or None), else one
        sentence saying why not and what to set instead. Lint (SPD120) and compile ask it."""
        return None

    def compile(self, request: CompileRequest) -> CompiledProgram:
        raise NotImplementedError

    def describe_compile(self, request: CompileRequest, *, exported: bool) -> list[str]:
        """``run --dry-run``'s lines for this program: where it would be written and the exact
        command that compiles it. Nothing is written or run. ``exported`` says whether
        ``request.onnx_path`` exists yet (if not, hashes that depend on it are unknown)."""
        return []

    def open_session(self, program: CompiledProgram, *, threads: int | None = None) -> Session:
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# generation: propose -> choose K -> verify -> accept


@dataclass
class Request:
    """One prompt of the workload, tokenized."""

    index: int
    prompt: str
    prompt_ids: np.ndarray  # int64 [n]
    max_new_tokens: int
    seed: int


@dataclass
class ProposeInput:
    """What a proposer sees of one active request in a step.

    ``tokens`` is prompt + generated so far (int64); its last token is the anchor that the
    target verifies next, and proposals continue after it. ``k_max`` is how many tokens this
    request can use this step (the largest compiled K, less when the request is near its end).
    """

    slot: int
    request_index: int
    tokens: np.ndarray
    num_prompt_tokens: int
    k_max: int


@dataclass
class TargetOutputs:
    """What the target computed for the rows a step committed, for proposers that read it.

    Row ``j`` is the input token at ``positions[j]`` (the anchor and the accepted proposals of
    a decode step, every prompt token after a prefill); the last row is the one whose LM-head
    logits produced the token that is now the anchor. ``head_logits`` [rows, heads, vocab]
    are the multi-projection heads' logits (head i guesses the token i places after the
    anchor), ``hidden_states`` [rows, hidden] the final-norm hidden states. Each is None
    unless the proposer asked for it (``Proposer.target_outputs``). Arrays are copies.
    """

    positions: np.ndarray
    head_logits: np.ndarray | None = None
    hidden_states: np.ndarray | None = None


@dataclass
class Proposal:
    """Up to k_max proposed tokens; ``probs[i]`` is the draft distribution token i was drawn
    from (float32 [n, vocab]) when the proposer has one, else None (point-mass drafts).

    ``grade`` is the proposer's own label for how the proposal was made, such that proposals
    of one grade tend to hold alike (prompt lookup: the length of the n-gram it matched); None
    when the proposer gives none. A K policy may read it (:meth:`KPolicy.see_grades`) and
    learns how each grade fared from :attr:`StepOutcome.scored_grades`; it never changes what
    is accepted."""

    tokens: np.ndarray
    probs: np.ndarray | None = None
    grade: int | None = None

    @staticmethod
    def empty() -> "Proposal":
        return Proposal(np.zeros(0, dtype=np.int64))


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters of the workload; temperature 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0


@dataclass(frozen=True)
class AuxiliaryModel:
    """A model a proposer needs compiled besides the target: a draft (later heads or an EAGLE
    layer). A proposer declares them from its validated config, through a method
    ``auxiliary_models(self) -> list[AuxiliaryModel]`` on its config model; the engine then
    exports, specializes and compiles each as its own stages (``export:<role>`` ...), before
    generation and under ``--compile-only``, and ``ProposerContext.build_session`` opens it."""

    role: str  # "draft", "eagle"; names the stages, the export dir and the program
    model_id: str | None = None  # written like the recipe's model.id; None: the target's model
    #: decode shapes: one per K, seq_len K+1; None: the recipe's K-list and K=0
    k_list: tuple[int, ...] | None = (0,)
    device_ids: tuple[int, ...] | None = None  # default: the target's device group
    num_cores: int | None = None  # default: the target's (backends that have it)
    #: which graph the export stage builds from the model directory: "causal_lm" (the model
    #: itself, DESIGN §4) or "eagle_layer" (the directory's EAGLE draft layer, see
    #: ``ExportRequest.graph``)
    graph: str = "causal_lm"


@dataclass(frozen=True)
class PeerEquivalent:
    """How other engines run the speculation a proposer's config describes, for
    ``spdflow bench --peers``: ``lookup_ngram``, an n-gram lookup in the tokens so far matching
    up to that many tokens (HF's prompt lookup decoding, llama.cpp's LlamaPromptLookupDecoding);
    ``assistant_model``, a draft model written like the recipe's ``model.id`` (HF's assisted
    generation). A proposer declares it through a method ``peer_equivalent(self) ->
    PeerEquivalent`` on its config model; peers then run those modes beside their plain greedy one."""

    lookup_ngram: int | None = None
    assistant_model: str | None = None


def peer_equivalent(config: Any) -> PeerEquivalent:
    """What a proposer's validated config declares other engines can run (nothing when it
    declares nothing)."""
    declare = getattr(config, "peer_equivalent", None)
    return declare() if callable(declare) else PeerEquivalent()


def auxiliary_models(config: Any) -> list[AuxiliaryModel]:
    """The models a proposer's validated config declares (none when it declares nothing)."""
    declare = getattr(config, "auxiliary_models", None)
    return list(declare()) if callable(declare) else []


@dataclass
class ProposerContext:
    """What a proposer factory gets besides its own validated config."""

    recipe: "Recipe"
    target: ModelInfo
    sampling: Sampling
    run_dir: Path
    #: builds (export + specialize + compile, cached) and opens a session for another model,
    #: e.g. a draft: build_session(model_spec, k_list=[...], role="draft") -> (Session, ModelInfo)
    build_session: Callable[..., Any] | None = None
    #: the greedy no-spec continuation of request i (computed once by the engine on first
    #: call); for proposers that model acceptance, like ``synthetic``.
    reference_output: Callable[[int], np.ndarray] | None = None
    #: the recipe file's folder, against which a proposer resolves relative paths in its config
    #: (e.g. a corpus); None when the recipe did not come from a file.
    base_dir: Path | None = None
    #: role -> the ONNX file the run's export stage wrote for that declared auxiliary model
    #: (e.g. "eagle"), or None when the run exported none under that role
    exported_graph: Callable[[str], Path | None] = lambda role: None


class Proposer:
    """Base class of proposers. One instance serves one run; state is kept per slot.

    The engine calls, for each request: ``add_request`` when it takes a slot, then every
    step ``propose`` (batched over active slots) and ``on_accepted`` with the tokens the step
    appended (also on K = 0 steps and on the prefill's first token), and ``remove_request`` when
    it leaves the slot. ``propose`` is not called on steps whose K policy budget is 0, and
    ``on_accepted`` only when the proposer overrides it (the base method does nothing).
    """

    name: str = ""
    #: True when the proposer can return fewer than k_max tokens (or none).
    may_propose_nothing: bool = True
    #: True when the proposer calls ``ctx.reference_output``: the engine then runs the greedy
    #: no-spec baseline before the run.
    needs_reference_output: bool = False
    #: Extra target outputs the proposer reads ("head_logits", "hidden_states"); the engine
    #: exports the target with them and calls ``on_target_outputs``. Read from the registered
    #: factory before the proposer exists, so register the class (or set it on the factory).
    target_outputs: tuple[str, ...] = ()

    def add_request(self, slot: int, request: Request) -> None:
        pass

    def propose(self, inputs: Sequence[ProposeInput]) -> list[Proposal]:
        raise NotImplementedError

    def on_accepted(self, slot: int, tokens: np.ndarray) -> None:
        pass

    def on_target_outputs(self, slot: int, outputs: TargetOutputs) -> None:
        """After the prefill and after every decode step (before ``on_accepted``), for
        proposers with ``target_outputs``: what the target computed for the committed rows."""

    def remove_request(self, slot: int) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class AcceptRow:
    """One batch row at the accept step."""

    slot: int
    proposal: Proposal  # already clipped to the request's k_max
    rng: np.random.Generator


class Acceptor:
    """Turns target logits and proposals into the tokens each request appends.

    ``accept(logits, rows, sampling)`` gets logits [batch, K+1, vocab] (row i of ``rows`` is
    batch row i; row j of the K+1 belongs to the anchor for j = 0 and to proposal j-1 after)
    and returns, per row, the accepted proposal prefix followed by exactly one token from the
    target (bonus or correction). So 1 <= len(result) <= len(proposal) + 1.
    """

    name: str = ""
    #: The workload temperatures at which this acceptor keeps the target's output distribution
    #: (lossless): "zero" (greedy decoding only), "positive" (sampling only), "any", or None
    #: (not declared). ``acceptance: auto`` picks a lossless one (:func:`spdflow.plugins.resolve_acceptance`)
    #: and a recipe naming one that is not lossless at its temperature is an error (SPD037).
    #: Read from the registered factory, so set it on the class.
    lossless_at: str | None = None

    def accept(
        self, logits: np.ndarray, rows: Sequence[AcceptRow], sampling: Sampling
    ) -> list[np.ndarray]:
        raise NotImplementedError


@dataclass(frozen=True)
class StepContext:
    """The batch a decode step is about to run, as a K policy sees it before anything is proposed.

    ``tokens_left[i]`` is how many tokens active row i may still generate (its max_new_tokens
    less what it has; it may stop earlier at EOS), in the order of the step's
    ``proposal_counts``. ``waiting`` is the number of requests queued for a free slot, which
    only continuous batching has (a static batch admits its next group once all its rows are
    done, so its ``waiting`` is always 0): with none waiting, the batch ends when its last row
    does, so rows far ahead matter less. ``requests[i]`` is the workload index of the request
    on active row i, so a policy can follow a request from step to step (same order as
    ``tokens_left``, the step's ``proposal_counts`` and its outcome's ``proposed``/``accepted``).
    """

    tokens_left: tuple[int, ...]
    waiting: int
    rows: int
    requests: tuple[int, ...] = ()


@dataclass(frozen=True)
class StepOutcome:
    """What one decode step did, as a K policy sees it in :meth:`KPolicy.observe`.

    ``proposed[i]`` is how many proposals of active row i were verified (after clipping to
    ``k``), ``accepted[i]`` how many of them were accepted. ``propose_s`` is 0.0 when the step
    did not call the proposer. Times are wall seconds of this process.

    ``scored`` (only after the policy called :meth:`PolicyServices.score_proposals`) holds one ``(checked, matched)`` pair
    per proposal decided at this step, whether it was verified, cut to a smaller K or not
    verified at all (K = 0): its tokens compared with the tokens the request went on to
    generate, ``matched`` the length of the agreeing prefix, ``checked`` the positions
    compared (``matched + 1`` after a mismatch). A proposal is decided at its first mismatch,
    when all of it matched, or when its request ends. For greedy acceptance this is exactly
    what verifying the whole proposal would have accepted; for sampling it is unbiased for
    proposals without draft probabilities (a point-mass draft token is accepted with the
    target's probability of that token, the chance it is sampled) and an underestimate
    otherwise.
    """

    k: int
    proposed: tuple[int, ...]
    accepted: tuple[int, ...]
    verify_s: float
    propose_s: float
    host_s: float
    scored: tuple[tuple[int, int], ...] = ()
    #: the request (workload index) each ``scored`` pair belongs to, in the same order
    scored_requests: tuple[int, ...] = ()
    #: the grade of each ``scored`` proposal (:attr:`Proposal.grade`), in the same order
    scored_grades: tuple[int | None, ...] = ()


class PolicyServices:
    """What the engine offers a K policy in :meth:`KPolicy.start`; a policy asks for what it uses.

    Nothing is measured or scored for a policy that does not ask.
    """

    def step_costs(self) -> dict[int, float]:
        """Median seconds of one verify run per compiled K on this session, measured on the
        first ask (a few runs per K, writing only the reserved KV slot) and kept by the run for
        the session's life: later generations on it get the same figures without re-measuring."""
        raise NotImplementedError

    def score_proposals(self) -> None:
        """From now on, every :class:`StepOutcome` carries ``scored``: each proposal compared with
        the tokens its request went on to generate, so a policy learns how long proposals hold
        even when they were cut to a smaller K or not verified (K = 0)."""
        raise NotImplementedError


class NoServices(PolicyServices):
    """Services for a policy used outside a generation loop (unit tests, lint): fixed step
    costs, if given, and scoring requests ignored."""

    def __init__(self, step_costs: dict[int, float] | None = None):
        self._costs = dict(step_costs or {})
        self.scoring = False

    def step_costs(self) -> dict[int, float]:
        return dict(self._costs)

    def score_proposals(self) -> None:
        self.scoring = True


class KPolicy:
    """Chooses the compiled K of a step from the proposal counts of the batch.

    Registered with a config model, the factory gets the recipe's validated ``k_policy.with:``
    block (``factory(config)``); without one, ``factory()``.

    The engine calls, per generation: ``start`` once, then every decode step, in this order,
    ``propose_budget`` (before the proposer runs), ``see_grades`` and ``choose_k`` (after it)
    and ``observe`` (after the verify and accept). Only ``choose_k`` is required; the others let
    a policy learn what K is worth on this machine, with what it asks of the
    :class:`PolicyServices`.
    """

    name: str = ""

    def required_ks(self, compiled_ks: Sequence[int]) -> list[int]:
        """The Ks this policy may choose from the recipe's K-list; each needs a compiled shape.

        Lint's shape coverage and the engine ask it before anything runs: a policy that only
        ever needs K = 0 runs without a proposer. The default is every K of the list.
        """
        return sorted(set(compiled_ks))

    def start(self, compiled_ks: Sequence[int], rows: int, services: PolicyServices) -> None:
        """Before the first step: the compiled K-list, the batch rows, and the engine's services
        (measured step costs, proposal scoring) to ask for what this policy uses."""

    def propose_budget(self, k_max: int, step: StepContext) -> int:
        """How many tokens the proposer may draft per request this step (0: do not call it).

        ``k_max`` is the largest compiled K; ``step`` describes the batch. The default asks
        for everything.
        """
        return k_max

    def see_grades(self, grades: Sequence[int | None]) -> None:
        """Just before :meth:`choose_k`: each row's proposal grade (:attr:`Proposal.grade`; None
        where the proposer gave none or nothing was proposed), in the order of
        ``proposal_counts``. The engine calls it only on a policy that overrides it."""

    def choose_k(self, proposal_counts: Sequence[int], compiled_ks: Sequence[int]) -> int:
        raise NotImplementedError

    def observe(self, outcome: StepOutcome) -> None:
        """After every decode step: what it proposed, accepted and cost."""


# --------------------------------------------------------------------------------------------
# what-if pricing (spdflow whatif / advise)


@dataclass
class CostContext:
    """What a cost model factory gets besides its own validated config: the run being priced."""

    run_dir: Path
    recipe: "Recipe"
    model_info: ModelInfo
    #: the run's trace.jsonl records (header included)
    records: list[dict] = field(default_factory=list)
    #: the recipe file's folder, against which a cost model resolves relative paths
    base_dir: Path | None = None
    #: times decode shapes on the run's own backend now and stores them with the run:
    #: ``measure(batch, ks, gap_s=0.0)`` -> :class:`spdflow.costs.GridEntry` (``gap_s``: host time
    #: kept busy after each timed run); None when it cannot run here
    measure: Callable[..., Any] | None = None


class CostModel:
    """Prices the target's runs for a what-if replay: seconds per verify run of a decode shape.

    ``verify_s(batch, k)`` is the steady time of one verify run with ``batch`` rows and K
    proposals (seq_len K+1) when the previous step used the same K; ``switch_s(batch)`` the extra
    time of the first step after a change of K; ``prefill_s(batch, seq_len)`` one prefill chunk
    (None: take the run's own measured prefill). Proposer and host time are not priced here
    unless ``includes_host``, ``host_per_step_s`` or ``propose_per_call_s`` says so: the replay
    measures them, since they run on the host either way. ``describe()`` says where every number
    comes from; it is printed with every prediction, and so are ``cautions(batch)``.
    """

    name: str = ""
    #: True when ``verify_s`` is the whole step, host and proposer included (e.g. an overhead
    #: fitted on an end-to-end time per token): the replay then runs on priced time alone
    #: instead of adding the host and proposer time it measures on this machine.
    includes_host: bool = False
    #: seconds of host work charged per decode step instead of the replay's own (None: its own)
    host_per_step_s: float | None = None
    #: seconds charged per proposer call instead of what the proposer took in the replay (None:
    #: what it took). With ``host_per_step_s`` set as well, no real time is counted at all and
    #: two replays agree exactly; set both to compare replays with each other (the proposer's
    #: real time moved a batch-8 replay's tokens/s by 1-2 % between two replays).
    propose_per_call_s: float | None = None

    def verify_s(self, batch: int, k: int) -> float:
        raise NotImplementedError

    def switch_s(self, batch: int) -> float:
        return 0.0

    def prefill_s(self, batch: int, seq_len: int) -> float | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"cost_model": self.name}

    def cautions(self, batch: int) -> list[str]:
        """Sentences on prices at ``batch`` that may mislead (printed as notes with the
        prediction); none by default."""
        return []


# --------------------------------------------------------------------------------------------
# a run, as lifecycle hooks see it

#: the stages of a run, in order
STAGES = ("export", "specialize", "compile", "generate", "report")


@dataclass
class StageResult:
    """One stage's outcome: status (ran, cached, failed, not_run), why, how long, its cache key."""

    name: str
    status: str = "not_run"
    reason: str = ""
    duration_s: float = 0.0
    cache_key: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def _utc_now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _new_run_id() -> str:
    import uuid

    return uuid.uuid4().hex[:12]


def _perf_counter() -> float:
    import time

    return time.perf_counter()


@dataclass
class RunState:
    """The mutable state of one run, passed to lifecycle hooks (``spdflow_before_run`` ...)."""

    recipe: "Recipe"
    run_dir: Path
    run_id: str = field(default_factory=_new_run_id)
    stages: dict[str, StageResult] = field(default_factory=lambda: {n: StageResult(n) for n in STAGES})
    status: str = "running"
    error: dict[str, str] | None = None
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)
    started_at: str = field(default_factory=_utc_now)
    t0: float = field(default_factory=_perf_counter)
    lossless: dict[str, Any] | None = None
    baseline: dict[str, Any] | None = None  # the no-spec baseline's metrics, when it ran in this process
    outputs: list[dict] = field(default_factory=list)
    oracle: dict[str, Any] | None = None  # the oracle section of the report (spdflow.oracle.run_oracle)


# --------------------------------------------------------------------------------------------
# registration


@dataclass(frozen=True)
class Registration:
    """One named implementation a plugin registered (proposer, backend, ...)."""

    kind: str
    name: str
    factory: Callable[..., Any]
    config: "type[BaseModel] | None"
    plugin: str
    description: str = ""
    aliases: tuple[str, ...] = ()  # other names the recipe may use (e.g. vLLM's 'ngram' for prompt_lookup)


REGISTRATION_KINDS = ("proposer", "backend", "k_policy", "acceptor", "workload", "cost_model")
