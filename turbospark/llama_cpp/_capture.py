"""``capture(path, ...)``: record the routing of every llama.cpp context llama-cpp-python creates in a block.

How it sees the routing. llama.cpp's scheduler calls a context's eval
callback (``cb_eval`` in ``llama_context_params``) twice per graph node it
is asked about: first to ask whether the caller wants the node's data, then,
once the node is computed, with the data. The capture answers "yes" only for
the routed-id tensors ``ffn_moe_topk-<layer>`` (int32 ``[top_k, n_tokens]``,
a strided view of ``ffn_moe_argsort``: ``src/llama-graph.cpp``
``build_moe_ffn``), and for ``ffn_moe_logits-<layer>`` / ``-biased`` only
while a requested router-logits row is still to come: every tensor taken
forces a graph split and a sync.

What it patches, for the block only (put back on exit): llama-cpp-python's
``llama_init_from_model`` (a context created inside the block gets the
callback; its parameters are copied, never changed in the caller's struct),
``llama_decode`` (the batch says which sequence, position and output flag
each token has: the callback's tensors carry only rows) and
``Llama.__init__`` (speculative decoding, ``draft_model=``, is refused: its
draft tokens are verified in blocks that the decode rules cannot tell from a
prompt).

Rows to tokens. llama.cpp splits a batch into ubatches of at most
``n_ubatch`` tokens; with one KV stream (``n_seq_max == 1`` or
``kv_unified``) it takes them in batch order (``split_simple``), so ubatch
``i`` is tokens ``[i * n_ubatch, (i + 1) * n_ubatch)``; a context with
several streams reorders tokens by sequence and is refused. Within a
ubatch, layers arrive in order, so a layer index not above the previous one
starts the next ubatch. The last layer runs only for tokens whose output
(logits) was requested (``inp_out_ids``): its tensor then has one row per
output token, in batch order, and only those rows are recorded; a tensor
whose row count matches neither all the ubatch's tokens nor its output
tokens stops the capture (never guessed).

Sequences and phases, per llama.cpp sequence id: a token is ``"decode"``
when it is the only token of its sequence in a ``llama_decode`` call and
comes right after a token whose output was requested (a sampled token fed
back); every other token is ``"prompt"``. A turbospark sequence starts at a
sequence id's first token, whenever its positions jump or go back (the KV
cache was cleared or truncated, as ``Llama.generate`` does when a new
prompt shares only a prefix with the cached one), and when prompt tokens
follow decode tokens (a new prompt). A token carrying several sequence ids
is routed once and tagged with its first.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import threading
from typing import Any, Iterator, Optional, Union

import numpy as np

from turbospark.llama_cpp import _ggml
from turbospark.recording import _env
from turbospark.recording.recorder import RouterHistogram

__all__ = ["ContextInfo", "LlamaCapture", "capture"]

_TOPK = 0
_LOGITS = 1
_PHASES = ("prompt", "decode")
# Every callback handed to llama.cpp stays alive for the process: a context may outlive the
# capture (it then sees a callback that asks for nothing), and a freed ctypes thunk would crash it.
_KEEP: list[Any] = []
_lock = threading.Lock()
_running: list["_Session"] = []  # the capture in progress (at most one)


@dataclasses.dataclass(frozen=True)
class ContextInfo:
    """What the capture knows of one recorded llama.cpp context.

    ``exact`` is True when the settings under which llama.cpp routes exactly
    like transformers' fp32 model hold (F32 K and V cache, flash attention
    off); ``logits_all`` is False when only some tokens have outputs, so the
    last layer is routed only for those (see docs/llama_cpp.md).
    """

    architecture: str
    num_layers: int
    num_experts: int
    top_k: int
    n_ubatch: int
    type_k: int
    type_v: int
    flash_attn_type: int
    logits_all: Optional[bool]

    @property
    def exact(self) -> bool:
        return self.type_k == _ggml.GGML_TYPE_F32 and self.type_v == _ggml.GGML_TYPE_F32 and self.flash_attn_type == 0


class LlamaCapture:
    """The handle ``capture`` yields: the recorder (made when the first context is created) and the contexts."""

    def __init__(self, session: "_Session") -> None:
        self._session = session

    @property
    def recorder(self) -> Optional[RouterHistogram]:
        """The ``RouterHistogram`` the block records into; None until a context is created in it."""
        return self._session.recorder

    @property
    def contexts(self) -> tuple[ContextInfo, ...]:
        """One ``ContextInfo`` per context created in the block so far, in creation order."""
        return tuple(state.info for state in self._session.contexts)

    def _require(self) -> RouterHistogram:
        if self._session.recorder is None:
            raise RuntimeError("no llama.cpp context has been created inside the capture yet: nothing is recorded")
        return self._session.recorder

    @property
    def counts(self) -> Any:
        """The counts so far, a read-only (num_layers, num_experts) int64 array; RuntimeError before any context."""
        return self._require().counts

    @property
    def passes(self) -> np.ndarray:
        """Routed passes per layer so far, (num_layers,) int64; RuntimeError before any context."""
        return self._require().passes

    def trace(self, layer: int) -> Optional[np.ndarray]:
        """One layer's trace so far as (passes, top_k) uint32 (None with the trace off); RuntimeError before any context."""
        return self._require().trace(layer)


class _Seq:
    """One llama.cpp sequence id of one context: which turbospark sequence it is, and where it stands."""

    __slots__ = ("number", "last_pos", "last_out", "decoding")

    def __init__(self, number: int, last_pos: int, last_out: bool, decoding: bool) -> None:
        self.number, self.last_pos, self.last_out, self.decoding = number, last_pos, last_out, decoding


class _Plan:
    """One ``llama_decode`` call: each token's sequence number, phase code and output flag, and the ubatches."""

    __slots__ = ("seq", "phase", "out", "n_ubatch", "n_tokens", "ubatch", "last_layer", "updates", "seen")

    def __init__(self, seq: np.ndarray, phase: np.ndarray, out: np.ndarray, n_ubatch: int,
                 updates: dict[int, _Seq]) -> None:
        self.seq, self.phase, self.out = seq, phase, out
        self.n_ubatch, self.n_tokens = n_ubatch, int(seq.shape[0])
        self.ubatch = -1
        self.last_layer = -1
        self.updates = updates
        self.seen = False

    def rows(self, layer: int, count: int) -> np.ndarray:
        """The batch indices of the ``count`` rows a layer's tensor holds; RuntimeError when they cannot be told."""
        if self.ubatch < 0 or layer <= self.last_layer:
            self.ubatch += 1
        self.last_layer = layer
        start = self.ubatch * self.n_ubatch
        if start >= self.n_tokens:
            raise RuntimeError(
                f"layer {layer} was routed in ubatch {self.ubatch}, but a batch of {self.n_tokens} tokens splits "
                f"into {-(-self.n_tokens // self.n_ubatch)} ubatch(es) of at most {self.n_ubatch}"
            )
        end = min(start + self.n_ubatch, self.n_tokens)
        if count == end - start:
            return np.arange(start, end)
        outputs = np.flatnonzero(self.out[start:end]) + start
        if count == outputs.shape[0]:
            return outputs  # the last layer: only the tokens whose logits were requested
        raise RuntimeError(
            f"layer {layer} routed {count} rows in a ubatch of {end - start} tokens of which {outputs.shape[0]} have "
            "outputs; the capture cannot tell which tokens they are, and records nothing it cannot place"
        )


class _Context:
    """One recorded llama.cpp context: its callback, its sequences and the decode call in progress."""

    def __init__(self, session: "_Session", ctx: int, info: ContextInfo, output_all: bool, g: _ggml.Ggml) -> None:
        self.session = session
        self.ctx = ctx
        self.info = info
        self.output_all = output_all
        self.ggml = g
        self.live = True
        self.plan: Optional[_Plan] = None
        self.seqs: dict[int, _Seq] = {}
        self.error: Optional[BaseException] = None
        self.wanted: dict[bytes, tuple[int, int]] = {
            f"ffn_moe_topk-{layer}".encode(): (_TOPK, layer) for layer in range(info.num_layers)
        }
        self.logits_layer = -1
        self.logits: Optional[np.ndarray] = None
        self.callback = self._make_callback()

    # ------------------------------------------------------------ the callback

    def want_logits(self, layer: int) -> None:
        self.logits_layer = layer
        for name in (f"ffn_moe_logits-{layer}", f"ffn_moe_logits_biased-{layer}"):
            self.wanted[name.encode()] = (_LOGITS, layer)

    def drop_logits(self) -> None:
        for name in [n for n, (kind, _) in self.wanted.items() if kind == _LOGITS]:
            del self.wanted[name]
        self.logits_layer, self.logits = -1, None

    def _make_callback(self) -> Any:
        import llama_cpp

        wanted, string_at, offset = self.wanted, ctypes.string_at, _ggml.NAME_OFFSET

        def callback(tensor: int, ask: bool, user_data: Any) -> bool:
            if ask:
                # One dict lookup per graph node: the hot path of every decode.
                return self.live and string_at(tensor + offset) in wanted
            if self.live and self.error is None:
                try:
                    self._take(tensor)
                except BaseException as exc:  # noqa: B036 - re-raised by the decode wrapper, outside C
                    self.error = exc
            return True

        function = llama_cpp.llama_cpp.ggml_backend_sched_eval_callback(callback)
        _KEEP.append(function)
        return function

    def _take(self, address: int) -> None:
        g = self.ggml
        g.check_tensor(address)
        kind, layer = self.wanted[ctypes.string_at(address + _ggml.NAME_OFFSET)]
        tensor = _ggml.GgmlTensor.from_address(address)
        name = tensor.name.decode("ascii", "replace")
        plan = self.plan
        if plan is None:
            raise RuntimeError(f"llama.cpp computed {name} outside a llama_decode call the capture saw "
                               "(a llama_decode bound before the capture began?)")
        plan.seen = True
        want = _ggml.GGML_TYPE_I32 if kind == _TOPK else _ggml.GGML_TYPE_F32
        if tensor.type != want or tensor.ne[2] != 1 or tensor.ne[3] != 1:
            raise RuntimeError(f"{name} has ggml type {tensor.type} and shape {list(tensor.ne)}; "
                               f"expected type {want} and [n, n_tokens, 1, 1]")
        width, count = int(tensor.ne[0]), int(tensor.ne[1])
        values = _read(g, address, tensor, np.int32 if kind == _TOPK else np.float32, count, width)
        if kind == _LOGITS:
            self.logits = values
            return
        if width != self.info.top_k:
            raise RuntimeError(f"{name} holds {width} ids per token; the model uses {self.info.top_k}")
        rows = plan.rows(layer, count)
        if self.logits is not None and self.logits.shape[0] != count:
            raise RuntimeError(f"ffn_moe_logits-{layer} has {self.logits.shape[0]} rows, {name} {count}")
        self.session.record(self, layer, values, plan.seq[rows], plan.phase[rows])

    # ------------------------------------------------------------ decode calls

    def begin(self, batch: Any, llama_cpp: Any) -> None:
        """Read a ``llama_batch`` before it is decoded: each token's sequence, phase and output flag."""
        n = int(batch.n_tokens)
        ids = [int(batch.seq_id[i][0]) if batch.n_seq_id[i] > 0 else 0 for i in range(n)] if batch.seq_id else [0] * n
        if batch.logits:
            out = np.ctypeslib.as_array(batch.logits, shape=(n,)) != 0
        else:
            out = np.zeros(n, dtype=bool)
            if n:
                out[-1] = True  # llama.cpp's default: only the batch's last token has an output
        if self.output_all:
            out[:] = True
        if batch.pos:
            pos = np.ctypeslib.as_array(batch.pos, shape=(n,)).astype(np.int64)
        else:
            pos = np.empty(n, dtype=np.int64)
            memory = llama_cpp.llama_get_memory(self.ctx)
            following: dict[int, int] = {}
            for i, s in enumerate(ids):
                if s not in following:
                    following[s] = llama_cpp.llama_memory_seq_pos_max(memory, s) + 1
                pos[i] = following[s]
                following[s] += 1
        groups: dict[int, list[int]] = {}
        for i, s in enumerate(ids):
            groups.setdefault(s, []).append(i)
        seq = np.empty(n, dtype=np.int64)
        phase = np.zeros(n, dtype=np.uint8)
        updates: dict[int, _Seq] = {}
        for s, rows in groups.items():
            state = self.seqs.get(s)
            first = int(pos[rows[0]])
            follows = state is not None and first == state.last_pos + 1
            decoding = len(rows) == 1 and follows and state is not None and state.last_out
            if not follows or (not decoding and state is not None and state.decoding):
                number = self.session.new_sequence()
            else:
                assert state is not None
                number = state.number
            seq[rows] = number
            phase[rows] = 1 if decoding else 0
            last = rows[-1]
            updates[s] = _Seq(number, int(pos[last]), bool(out[last]), decoding)
        self.plan = _Plan(seq, phase, out, self.info.n_ubatch, updates)

    def end(self, status: int) -> None:
        plan, self.plan = self.plan, None
        error, self.error = self.error, None
        if plan is not None and status == 0:
            self.seqs.update(plan.updates)
            recorder = self.session.recorder
            if error is None and recorder is not None and plan.seq.shape[0]:
                # One llama_decode that routed its batch (all its ubatches) is one engine step.
                recorder.mark_step()
        if error is not None:
            if not isinstance(error, KeyboardInterrupt):
                self.session.refuse(error)
            raise error


class _Session:
    """One ``capture`` block: the patches, the recorder (made at the first context) and the contexts."""

    def __init__(self, path: Optional[str], from_env: bool, trace: Union[bool, str, None],
                 router_logits: Optional[tuple[int, int]], trace_cap: Optional[int], checkpoint: Optional[float]) -> None:
        self.path, self.from_env = path, from_env
        self.trace, self.router_logits = trace, router_logits
        self.trace_cap, self.checkpoint = trace_cap, checkpoint
        self.recorder: Optional[RouterHistogram] = None
        self.contexts: list[_Context] = []
        self.refused: Optional[BaseException] = None
        self.next_seq = 0
        self.patched: list[tuple[Any, str, Any]] = []
        self.logits_done = False
        self.lock = threading.Lock()

    # ------------------------------------------------------------ patches

    def install(self) -> None:
        import llama_cpp
        import llama_cpp.llama

        low = llama_cpp.llama_cpp
        init, decode, construct = low.llama_init_from_model, low.llama_decode, llama_cpp.llama.Llama.__init__
        session = self

        def llama_init_from_model(model: Any, params: Any) -> Any:
            return session.create_context(init, model, params)

        def llama_decode(ctx: Any, batch: Any) -> int:
            state = session.find(ctx)
            if state is None:
                return int(decode(ctx, batch))
            state.begin(batch, low)
            status = -1
            try:
                status = int(decode(ctx, batch))
            finally:
                state.end(status)
            return status

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if kwargs.get("draft_model") is not None:
                self._stack = contextlib.ExitStack()  # Llama.__del__ closes it: refused before it exists
                raise ValueError(
                    f"turbospark.llama_cpp.capture cannot record speculative decoding (draft_model="
                    f"{type(kwargs['draft_model']).__name__}): the drafted tokens are verified in blocks, which the "
                    "capture would record as prompt tokens of new sequences; construct the Llama without draft_model"
                )
            construct(self, *args, **kwargs)

        for owner, name, value in ((low, "llama_init_from_model", llama_init_from_model),
                                   (low, "llama_decode", llama_decode),
                                   (llama_cpp.llama.Llama, "__init__", __init__)):
            self.patched.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)

    def remove(self) -> None:
        for owner, name, value in reversed(self.patched):
            setattr(owner, name, value)
        self.patched.clear()
        for state in self.contexts:
            state.live = False  # the context may live on: its callback now asks for nothing

    def find(self, ctx: Any) -> Optional[_Context]:
        address = ctx if isinstance(ctx, int) or ctx is None else getattr(ctx, "value", None)
        for state in self.contexts:
            if state.ctx == address:
                return state
        return None

    # ------------------------------------------------------------ contexts

    def create_context(self, init: Any, model: Any, params: Any) -> Any:
        import llama_cpp

        low = llama_cpp.llama_cpp
        if ctypes.cast(params.cb_eval, ctypes.c_void_p).value:
            raise ValueError("turbospark.llama_cpp.capture cannot record a context that already has an eval callback "
                             "(cb_eval is set): llama.cpp takes one per context")
        if not params.kv_unified and params.n_seq_max > 1:
            raise ValueError(
                f"turbospark.llama_cpp.capture cannot record a context with n_seq_max={params.n_seq_max} and "
                "kv_unified=False: llama.cpp then splits batches by sequence (split_equal) and the callback's rows "
                "cannot be matched to tokens; set kv_unified=True"
            )
        for check, kind in ((low.llama_model_is_recurrent, "recurrent"), (low.llama_model_is_hybrid, "hybrid")):
            if check(model):
                raise TypeError(f"turbospark.llama_cpp.capture cannot record a {kind} model: llama.cpp splits its "
                                "batches by sequence, and the callback's rows cannot be matched to tokens")
        arch = _meta(low, model, "general.architecture") or "?"
        experts = int(_meta(low, model, f"{arch}.expert_count") or 0)
        top_k = int(_meta(low, model, f"{arch}.expert_used_count") or 0)
        layers = int(low.llama_model_n_layer(model))
        if experts <= 0 or top_k <= 0:
            raise TypeError(f"turbospark.llama_cpp.capture: the model ({arch}) has no routed experts "
                            f"({arch}.expert_count={experts}, {arch}.expert_used_count={top_k}); nothing to record")
        g = _ggml.ggml()
        with self.lock:
            self._ensure_recorder(layers, experts, top_k, arch)
            own = type(params).from_buffer_copy(params)  # the caller's struct keeps no callback
            info = ContextInfo(arch, layers, experts, top_k, int(min(params.n_ubatch, params.n_batch) or 512),
                               int(params.type_k), int(params.type_v), int(params.flash_attn_type), None)
            state = _Context(self, 0, info, bool(params.embeddings), g)
            if self.router_logits_wanted() is not None:
                state.want_logits(self.router_logits_wanted()[0])  # type: ignore[index]
            own.cb_eval = state.callback
            own.cb_eval_user_data = None
            ctx = init(model, own)
            if not ctx:
                return ctx
            state.ctx = ctx if isinstance(ctx, int) else ctx.value
            # llama.cpp may lower n_ubatch (it never exceeds n_batch): take the context's own value.
            info = dataclasses.replace(info, n_ubatch=int(low.llama_n_ubatch(ctx)))
            state.info = info
            self.contexts.append(state)
        return ctx

    def _ensure_recorder(self, layers: int, experts: int, top_k: int, arch: str) -> None:
        if self.recorder is not None:
            have = (self.recorder.num_layers, self.recorder.num_experts, self.recorder.top_k)
            if have != (layers, experts, top_k):
                raise ValueError(
                    f"turbospark.llama_cpp.capture records one model shape per capture: this {arch} model has "
                    f"{layers} layers, {experts} experts, top-{top_k}; the capture already holds {have[0]} layers, "
                    f"{have[1]} experts, top-{have[2]}"
                )
            return
        if self.from_env:
            config = _env.config_from_env(layers)
            assert config is not None  # capture() checked the variable
            config = dataclasses.replace(
                config, trace=config.trace if self.trace is None else self.trace,
                trace_cap=config.trace_cap if self.trace_cap is None else self.trace_cap,
                checkpoint=config.checkpoint if self.checkpoint is None else self.checkpoint,
                router_logits=config.router_logits if self.router_logits is None else self.router_logits,
            )
            given = frozenset(["trace"]) if self.trace is not None else frozenset()
            self.recorder = RouterHistogram.from_config(config, layers, experts, top_k, given=given)
        else:
            assert self.path is not None
            self.recorder = RouterHistogram(self.path, layers, experts, top_k, trace=self.trace or False,
                                            router_logits=self.router_logits, trace_cap=self.trace_cap,
                                            checkpoint=self.checkpoint)

    def router_logits_wanted(self) -> Optional[tuple[int, int]]:
        if self.recorder is None or self.logits_done:
            return None
        request = self.recorder._logits_capture()
        if request is None or request[2] is not None:
            return None
        return (request[0], request[1])

    def new_sequence(self) -> int:
        number, self.next_seq = self.next_seq, self.next_seq + 1
        return number

    # ------------------------------------------------------------ recording

    def record(self, state: _Context, layer: int, ids: np.ndarray, seq: np.ndarray, phase: np.ndarray) -> None:
        recorder = self.recorder
        assert recorder is not None
        logits, split = state.logits, -1
        if logits is not None and layer == state.logits_layer:
            state.logits = None
            wanted = self.router_logits_wanted()
            if wanted is not None:
                split = wanted[1] - int(recorder.passes[layer])
                if not 0 <= split < ids.shape[0]:
                    split = -1
        if split < 0:
            _record_runs(recorder, layer, ids, seq, phase)
            return
        _record_runs(recorder, layer, ids[:split], seq[:split], phase[:split])
        recorder.record_router_logits(layer, logits[split])  # the recorder keeps it at exactly this pass
        _record_runs(recorder, layer, ids[split:], seq[split:], phase[split:])
        self.logits_done = True
        for other in self.contexts:
            other.drop_logits()  # no more graph splits for logits

    def refuse(self, error: BaseException) -> None:
        if self.refused is None:
            self.refused = error


def _record_runs(recorder: RouterHistogram, layer: int, ids: np.ndarray, seq: np.ndarray, phase: np.ndarray) -> None:
    """Record rows in order, one ``record_batch`` per run of rows in the same phase."""
    n = ids.shape[0]
    if n == 0:
        return
    if phase[0] == phase[-1] and (n < 3 or not (phase != phase[0]).any()):
        recorder.record_batch(layer, ids, seq=seq, phase=_PHASES[int(phase[0])])
        return
    cuts = [0, *(np.flatnonzero(phase[1:] != phase[:-1]) + 1).tolist(), n]
    for a, b in zip(cuts, cuts[1:]):
        recorder.record_batch(layer, ids[a:b], seq=seq[a:b], phase=_PHASES[int(phase[a])])


def _read(g: _ggml.Ggml, address: int, tensor: _ggml.GgmlTensor, dtype: Any, count: int, width: int) -> np.ndarray:
    """A tensor's ``[width, count]`` elements as a (count, width) array, read with the tensor's own strides."""
    if count == 0 or width == 0:
        return np.zeros((count, width), dtype=dtype)
    size = int(g.nbytes(address))
    buffer = np.empty(size, dtype=np.uint8)
    g.tensor_get(address, buffer.ctypes.data, 0, size)
    view = np.ndarray((count, width), dtype=dtype, buffer=buffer, strides=(int(tensor.nb[1]), int(tensor.nb[0])))
    return np.ascontiguousarray(view)


def _meta(low: Any, model: Any, key: str) -> Optional[str]:
    buffer = ctypes.create_string_buffer(256)
    if low.llama_model_meta_val_str(model, key.encode(), buffer, ctypes.sizeof(buffer)) < 0:
        return None
    return buffer.value.decode("utf-8", "replace")


@contextlib.contextmanager
def capture(
    path: Union[str, "os.PathLike[str]", None] = None,
    *,
    trace: Union[bool, str, None] = None,
    pilot: Optional[str] = None,
    router_logits: Optional[tuple[int, int]] = None,
    trace_cap: Optional[int] = None,
    checkpoint: Optional[float] = None,
) -> Iterator[Optional[LlamaCapture]]:
    """Record the routing of every llama.cpp context llama-cpp-python creates while the block runs.

    ``path``: where the capture is written when the block ends; None lets
    the environment decide, as ``RouterHistogram.from_env`` does (with
    ``TURBOSPARK_ROUTER_HIST`` unset nothing is patched, recorded or
    written, and the block gets None). ``trace``: keep every pass's ids
    (None: off, or with ``path=None`` what ``TURBOSPARK_ROUTER_TRACE``
    says; ``"stream"``: streamed to a sidecar). ``router_logits``: a
    ``(layer, pass)`` pair whose router logits are kept (from
    ``ffn_moe_logits``; with ``path=None``, the
    ``TURBOSPARK_ROUTER_LOGITS_*`` variables). ``trace_cap``,
    ``checkpoint``: as ``RouterHistogram``'s. ``pilot`` must be None.

    Every ``llama_cpp.Llama`` (or low-level context) created in the block is
    recorded into one ``RouterHistogram`` of the model's shape (layers =
    ``llama_model_n_layer``, experts and top-k from the GGUF's
    ``<arch>.expert_count`` / ``expert_used_count``), made when the first
    context is created. Passes are tagged with sequence ids and phases
    (this module's docstring gives the rules). Yields a ``LlamaCapture``
    (or None when recording is off). On exit the patches are removed, a
    context that lives on records nothing more, and the capture is written
    (nothing is written when no context was created).

    Raises ``ValueError`` for ``pilot`` (llama.cpp's eval callback reads
    tensors but cannot run a router on another layer's activations, so a
    pilot probe cannot be wired), a bad ``trace``, or when
    ``TURBOSPARK_PILOT_PROBE`` asks for one; ``RuntimeError`` when a capture
    is already running; ``ImportError`` without llama-cpp-python;
    ``turbospark.llama_cpp.LayoutError`` when the loaded ggml's tensor
    layout differs from the declared one. Inside the block, creating a
    context raises ``ValueError`` (several KV streams, an eval callback
    already set, a second model of another shape, ``draft_model=``) or
    ``TypeError`` (no routed experts; a recurrent or hybrid model), and
    ``llama_decode`` raises ``RuntimeError`` when a routed tensor cannot be
    placed (the capture is then discarded, nothing written).
    """
    if pilot is not None:
        raise ValueError(
            f"pilot={pilot!r}: turbospark.llama_cpp cannot run a pilot probe: llama.cpp's eval callback only reads the "
            "tensors the graph computes, and cannot run one layer's router on another layer's activations"
        )
    if trace is not None and not isinstance(trace, bool) and trace != "stream":
        raise ValueError(f"trace must be None, True, False or 'stream', got {trace!r}")
    from_env = path is None
    if from_env:
        if not os.environ.get(_env.HIST):
            yield None  # recording off: nothing patched, no cost
            return
        if os.environ.get(_env.PILOT) is not None:
            raise ValueError(
                f"{_env.PILOT} is set: turbospark.llama_cpp cannot run a pilot probe (llama.cpp's eval callback only "
                "reads tensors, it cannot run one layer's router on another layer's activations); unset it"
            )
    _ggml.ggml()  # ImportError / LayoutError before anything is patched
    session = _Session(None if path is None else os.fsdecode(path), from_env, trace, router_logits, trace_cap, checkpoint)
    with _lock:
        if _running:
            raise RuntimeError("a turbospark.llama_cpp capture is already running; one at a time")
        _running.append(session)
    try:
        session.install()
        try:
            yield LlamaCapture(session)
        finally:
            session.remove()
            recorder = session.recorder
            if recorder is not None:
                if session.refused is not None:
                    recorder.discard()
                else:
                    recorder.close()
    finally:
        with _lock:
            _running.remove(session)
