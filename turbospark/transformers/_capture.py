"""``capture(model, ...)``: record a transformers model's routing while it runs.

Hooks, and what each one knows:
- a pre-hook on the model (with kwargs) sees each forward call's input shape
  and ``attention_mask``, so it decides which rows of that call are real
  tokens (not padding, not a sequence ``generate`` has finished), which
  sequence each row belongs to and whether the call is prompt or decode;
- a forward hook on each router reads the chosen ids and records the kept
  rows of the block in one call;
- a forward hook on the model closes the call's engine step: each forward
  call of the model (a prompt, one chunk of a chunked prefill, one decode
  step of ``generate``, a plain forward) that kept rows is one step
  (``mark_step``, the capture's ``step_passes``); calls inside the model's
  own forward (the decoder stack, its layers, the probe) are not steps;
- with the pilot probe, a pre-hook on the pre-MoE norm of each routed layer
  takes that layer's post-attention residual and runs the target layer's norm
  and router on it through their ``forward`` methods, which fire no hooks.
``generate`` is followed through the model's own methods, replaced on the
instance for the duration (an override the user set on the instance is
wrapped, and put back on exit): ``_prefill`` (the calls inside it are prompt
tokens; with ``prefill_chunk_size`` it makes one call per chunk, and the later
ones continue the sequences the first started), ``_get_stopping_criteria`` (its result is wrapped so the capture
sees which sequences each step finishes) and ``_validate_generation_mode``
(assisted generation is refused before the model runs: its candidate
tokens are routed in blocks the decode-step rules cannot follow; so is
beam search, ``num_beams > 1``: it reorders the batch rows every step,
and a beam's tokens are routed on whichever row holds it then, which
sequence tags that follow rows cannot express).

Everything that can refuse the capture (the model's routers, the probe's
norms, the arguments) is resolved before the recorder exists, so a refused
capture never writes, or overwrites, a file.

torch.compile: a graph compiled before the hooks were added never runs them
(dynamo does not guard on hooks), so a capture would silently record
nothing. ``capture(torch.compile(model))`` records the module it wraps, and
for the capture's duration every compiled call of the model and its
submodules (the wrapper's forward, ``module.compile()``, a forward replaced
by ``torch.compile(module.forward)``) is set back to the eager one it
compiled; after every ``generate`` and forward call the capture checks that
each router's hook ran, and raises ``RuntimeError`` naming the silent layers
if one did not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import types
import weakref
from typing import Any, Iterator, Optional, Union

import torch
from torch import nn

from turbospark.recording import _env
from turbospark.transformers._model_recorder import ModelRecorder
from turbospark.transformers._routers import RouterSite, Routing, find_routing
from turbospark.transformers._sink import Sink

__all__ = ["capture", "pre_moe_norm"]

# Decoder-layer attributes that hold the norm applied right before the MoE
# block, most specific first: a layer with both a pre_feedforward_layernorm and
# a post_attention_layernorm (Gemma-style) applies the latter to the attention
# output, before the residual add. Jamba calls its own pre_ff_layernorm.
NORM_NAMES = ("pre_feedforward_layernorm", "pre_ff_layernorm", "ffn_norm", "post_attention_layernorm")
_MISSING = object()
_PILOTS = (None, "next", "self")
# Models with a capture in progress: a second capture or a verify on them
# would see the first one's hooks fire.
_active: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


def pre_moe_norm(layer: nn.Module, index: int) -> nn.Module:
    """The norm a decoder layer applies right before its MoE block; ValueError when it has none we know."""
    for name in NORM_NAMES:
        norm = getattr(layer, name, None)
        if isinstance(norm, nn.Module):
            return norm
    raise ValueError(
        f"the pilot probe needs the pre-MoE norm of decoder layer {index} ({type(layer).__name__}); "
        f"it has none of {', '.join(NORM_NAMES)}"
    )


@dataclasses.dataclass(frozen=True)
class _ProbePlan:
    """Where the probe's hooks go: (source norm, target router site, target norm) per predicted layer."""

    links: tuple[tuple[nn.Module, RouterSite, nn.Module], ...]
    distances: tuple[int, ...]
    # Every routed layer whose norm the probe uses: (site, norm attribute name, norm).
    norms: tuple[tuple[RouterSite, str, nn.Module], ...]


def _plan_probe(routing: Routing, pilot: Optional[str]) -> Optional[_ProbePlan]:
    """The probe's wiring for ``pilot`` (None when off); ValueError when a routed layer has no known pre-MoE norm."""
    if pilot is None:
        return None
    sites, layers = routing.sites, routing.layers
    pairs = [(site, site) for site in sites] if pilot == "self" else list(zip(sites, sites[1:]))
    distances = [0] * len(layers)
    links = []
    norms: dict[int, tuple[RouterSite, str, nn.Module]] = {}
    for source, target in pairs:
        source_norm = pre_moe_norm(layers[source.layer], source.layer)
        target_norm = pre_moe_norm(layers[target.layer], target.layer)
        distances[target.layer] = target.layer - source.layer
        links.append((source_norm, target, target_norm))
        for site, norm in ((source, source_norm), (target, target_norm)):
            name = next(n for n in NORM_NAMES if getattr(layers[site.layer], n, None) is norm)
            norms[site.layer] = (site, name, norm)
    return _ProbePlan(tuple(links), tuple(distances), tuple(norms[layer] for layer in sorted(norms)))


class _Session:
    """The per-call state the hooks share, and the hooks themselves."""

    def __init__(
        self,
        model: nn.Module,
        routing: Routing,
        recorder: ModelRecorder,
        probe: Optional[_ProbePlan],
        wrapper: Optional[nn.Module] = None,
    ) -> None:
        self.model = model
        self.wrapper = wrapper  # the torch.compile wrapper capture() was given, if any
        self.routing = routing
        self.sink = Sink(recorder, _device(routing), routing.top_k)
        self.probe = probe if self.sink.predicting else None
        self.pilot = None if self.probe is None else ("self" if recorder.pilot_offset() == 0 else "next")
        self.handles: list[Any] = []
        # (module, name, what the instance held before: _MISSING when nothing), in patching order.
        self.patched: list[tuple[nn.Module, str, Any]] = []
        # Router hook calls per layer: a call whose routers stayed silent is refused.
        self.fired = [0] * len(routing.layers)
        # Forward calls of the decoder stack so far, and the call each router last fired in: a
        # router that fires twice in one call (a looped or shared layer) refuses the capture.
        self.stack_calls = 0
        self.fired_in_call = [-1] * len(routing.layers)
        self.refused = False
        self._fired_at_call: Optional[list[int]] = None
        # Per forward call: which rows to keep (None: all), their sequence ids, the phase.
        self.mask: Optional[torch.Tensor] = None
        self.seq: Optional[torch.Tensor] = None
        self.phase = "prompt"
        # Per generate call: inside _prefill?, its model calls so far (a chunked prefill,
        # prefill_chunk_size=N, makes one per chunk), rows finished so far, first sequence id.
        self.prefilling = False
        self.prefill_calls = 0
        self.in_generate = False
        self.finished: Optional[torch.Tensor] = None  # CPU bool, one per row
        self.any_finished = False
        self._seq_key: Optional[tuple[int, int, int]] = None
        self._seq_rows_cache: Optional[torch.Tensor] = None
        self.next_seq = 0
        self.seq_base = 0
        # Whether the current forward call keeps rows (an all-padding call routes nothing: no step), and
        # the router calls before it (a call whose routers never ran is no step either).
        self.step_rows = False
        self._fired_before_call = 0

    # ------------------------------------------------------------ installing

    def install(self) -> None:
        self._run_eagerly()
        self.handles.append(self.model.register_forward_pre_hook(self._on_model_call, with_kwargs=True))
        self.handles.append(self.model.register_forward_hook(self._after_model_call))
        self.handles.append(_decoder_stack(self.model, self.routing).register_forward_pre_hook(self._on_stack_call))
        for site in self.routing.sites:
            self.handles.append(site.router.register_forward_hook(self._router_hook(site)))
        if self.probe is not None:
            for site, name, norm in self.probe.norms:
                self._check_wiring(site, name, norm)
            for source_norm, target, target_norm in self.probe.links:
                self.handles.append(source_norm.register_forward_pre_hook(self._probe_hook(target, target_norm)))
            if self.pilot == "next":
                self.sink.recorder.pilot_distances = self.probe.distances
        if all(hasattr(self.model, name) for name in ("generate", "_prefill", "_get_stopping_criteria")):
            self._patch("generate", self._wrap_generate(self.model.generate))
            self._patch("_prefill", self._wrap_prefill(self.model._prefill))
            self._patch("_get_stopping_criteria", self._wrap_criteria(self.model._get_stopping_criteria))
            if hasattr(self.model, "_validate_generation_mode"):
                self._patch("_validate_generation_mode", self._wrap_mode_check(self.model._validate_generation_mode))

    def _check_wiring(self, site: RouterSite, name: str, norm: nn.Module) -> None:
        """On the first call, the norm the probe uses must produce exactly its router's input.

        A layer that normalises elsewhere (a post-norm on the attention
        output, a MoE block fed the raw residual) would have the probe predict
        from the wrong activations, silently.
        """
        seen: dict[str, torch.Tensor] = {}

        def keep(module: nn.Module, args: tuple, output: Any) -> None:
            seen["output"] = output

        def check(module: nn.Module, args: tuple, output: Any) -> None:
            produced = seen.pop("output", None)
            for handle in handles:
                handle.remove()
            given = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if (
                not isinstance(produced, torch.Tensor)
                or given is None
                or produced.numel() != given.numel()
                or not torch.equal(produced.reshape(given.shape), given)
            ):
                raise RuntimeError(
                    f"the pilot probe cannot predict layer {site.layer} exactly: its {name} "
                    f"({type(norm).__name__}) does not produce the input of its router ({site.name}), so the "
                    "probe would route the wrong activations; capture without pilot="
                )

        handles = [norm.register_forward_hook(keep), site.router.register_forward_hook(check)]
        self.handles.extend(handles)

    def _patch(self, name: str, replacement: Any, module: Optional[nn.Module] = None) -> None:
        # The instance's own attribute (a user's override), if any, is put back by remove().
        target = self.model if module is None else module
        self.patched.append((target, name, target.__dict__.get(name, _MISSING)))
        object.__setattr__(target, name, replacement)

    def _run_eagerly(self) -> None:
        """Set every compiled call of the model (and of the wrapper) back to the eager one, until remove()."""
        modules = list(self.model.modules()) + ([self.wrapper] if self.wrapper is not None else [])
        for module in modules:
            if module.__dict__.get("_compiled_call_impl") is not None:  # module.compile()
                self._patch("_compiled_call_impl", None, module)
            for name in ("forward", "_forward"):  # torch.compile(module.forward); the wrapper's own
                original = getattr(module.__dict__.get(name), "_torchdynamo_orig_callable", None)
                if original is not None:
                    self._patch(name, original, module)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        for module, name, previous in reversed(self.patched):
            if previous is _MISSING:
                module.__dict__.pop(name, None)
            else:
                object.__setattr__(module, name, previous)
        self.patched.clear()

    def _check_fired(self, before: list[int], what: str) -> None:
        silent = [site.layer for site in self.routing.sites if self.fired[site.layer] == before[site.layer]]
        if silent:
            raise RuntimeError(
                f"capture() recorded nothing of layer(s) {silent} during {what}: their routers' hooks did not run, "
                "as when a graph torch.compile built before capture() runs the model (dynamo does not guard on "
                "hooks); capture the model uncompiled"
            )

    # ------------------------------------------------------------ generate

    def _wrap_generate(self, generate: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.in_generate = True
            before = list(self.fired)
            try:
                result = generate(*args, **kwargs)
            finally:
                self.in_generate = False
                self.finished = None
            self._check_fired(before, "generate()")
            return result

        return wrapped

    def _wrap_prefill(self, prefill: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.prefilling = True
            self.prefill_calls = 0
            try:
                return prefill(*args, **kwargs)
            finally:
                self.prefilling = False

        return wrapped

    def _wrap_criteria(self, get_criteria: Any) -> Any:
        from transformers.generation.stopping_criteria import StoppingCriteriaList

        session = self

        class Observed(StoppingCriteriaList):
            """generate's own stopping criteria, reporting each step's verdict to the capture."""

            def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
                done = super().__call__(input_ids, scores, **kwargs)
                if session.finished is not None and session.finished.shape == done.shape:
                    session.finished = session.finished | done.cpu()
                    session.any_finished = bool(session.finished.any())
                return done

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return Observed(get_criteria(*args, **kwargs))

        return wrapped

    def _wrap_mode_check(self, validate: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            # (generation_mode, generation_config, generation_mode_kwargs), as generate passes them.
            names = ("generation_mode", "generation_config", "generation_mode_kwargs")
            values = dict(zip(names, args), **kwargs)
            mode, config = values.get("generation_mode"), values.get("generation_config")
            refusal = _assisted_refusal(mode, config, values.get("generation_mode_kwargs") or {}) or _beam_refusal(mode, config)
            if refusal:
                raise ValueError(refusal)
            return validate(*args, **kwargs)

        return wrapped

    # ------------------------------------------------------------ per call

    def _on_model_call(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._fired_before_call = sum(self.fired)
        self.step_rows = self._set_rows(args, kwargs)

    def _set_rows(self, args: tuple, kwargs: dict) -> bool:
        """The call's kept rows, sequences and phase; returns whether it keeps any row (False: no step)."""
        tokens = kwargs.get("input_ids", args[0] if args else None)
        if tokens is None:
            tokens = kwargs.get("inputs_embeds")
        if not isinstance(tokens, torch.Tensor) or tokens.dim() < 2:
            self.mask, self.seq, self._fired_at_call = None, None, None
            return True  # every row the routers see is kept
        batch, length = int(tokens.shape[0]), int(tokens.shape[1])
        self._fired_at_call = list(self.fired) if batch * length and not self.in_generate else None
        if self.in_generate and not self.prefilling:
            self._decode_step(batch, length)
            return self.mask is None or bool(self.mask.any())
        decode = not self.in_generate and self._cache_holds_tokens(kwargs)
        # A chunked prefill's later chunks continue the prompts its first chunk started.
        continuing = self.prefilling and self.prefill_calls > 0
        if self.prefilling:
            self.prefill_calls += 1
        if not decode and not continuing:
            # A prompt starts new sequences, numbered after every earlier one.
            self.seq_base, self.next_seq = self.next_seq, self.next_seq + batch
            self.finished = torch.zeros(batch, dtype=torch.bool) if self.in_generate else None
            self.any_finished = False
        self.phase = "decode" if decode else "prompt"
        keep = self._keep(kwargs.get("attention_mask", args[1] if len(args) > 1 else None), batch, length)
        flat = None if keep is None else keep.reshape(-1).cpu()
        self.mask = None if flat is None or bool(flat.all()) else flat
        self.seq = self._seq_rows(batch, length)
        return batch * length > 0 and (self.mask is None or bool(self.mask.any()))

    def _after_model_call(self, module: nn.Module, args: tuple, output: Any) -> None:
        """A forward call of the model returned (not run when it raised)."""
        # A plain forward call (generate checks once, after it returns).
        before, self._fired_at_call = self._fired_at_call, None
        if before is not None:
            self._check_fired(before, f"a forward call of {type(self.model).__name__}")
        if self.step_rows and sum(self.fired) > self._fired_before_call and not _called_inside_itself(self.model):
            # Every router of the call has recorded its rows: they form one engine step.
            self.sink.end_step()

    def _decode_step(self, batch: int, length: int) -> None:
        """A decode call of generate: only each row's newest token is new, and only for rows not finished.

        (generate feeds the whole sequence again when it runs without a
        cache; the mask of a newly generated token is always 1.)
        """
        self.phase = "decode"
        if length == 1 and not self.any_finished:
            self.mask = None
        else:
            keep = torch.zeros(batch, length, dtype=torch.bool)
            if self.finished is not None and self.finished.shape[0] == batch:
                keep[:, -1] = ~self.finished
            else:
                keep[:, -1] = True
            self.mask = keep.reshape(-1)
        self.seq = self._seq_rows(batch, length)

    def _seq_rows(self, batch: int, length: int) -> Optional[torch.Tensor]:
        """Each row's sequence id, built once per shape (every decode step has the same)."""
        if not self.sink.tags_sequences:
            return None
        key = (self.seq_base, batch, length)
        if self._seq_key != key:
            self._seq_key = key
            self._seq_rows_cache = torch.arange(self.seq_base, self.seq_base + batch, dtype=torch.int64).repeat_interleave(length)
        return self._seq_rows_cache

    @staticmethod
    def _cache_holds_tokens(kwargs: dict) -> bool:
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        length = getattr(cache, "get_seq_length", None)
        return bool(length is not None and length() > 0)

    @staticmethod
    def _keep(attention_mask: Any, batch: int, length: int) -> Optional[torch.Tensor]:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
            return None  # no mask, or a prepared 4-D one: every row is a token
        return attention_mask[:, -length:].to(torch.bool)

    def _on_stack_call(self, module: nn.Module, args: tuple) -> None:
        self.stack_calls += 1

    def _refuse_refire(self, site: RouterSite) -> None:
        self.refused = True
        raise RuntimeError(
            f"capture() cannot record {type(self.model).__name__}: the router of decoder layer {site.layer} "
            f"({site.name}) ran twice in one forward call (a looped or shared decoder layer routes each token more "
            "than once per forward, and a capture holds one pass per token and layer); the capture is discarded, "
            "nothing is written"
        )

    def _router_hook(self, site: RouterSite) -> Any:
        sink, layer, fired, fired_in_call = self.sink, site.layer, self.fired, self.fired_in_call

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            if fired_in_call[layer] == self.stack_calls:
                self._refuse_refire(site)
            fired_in_call[layer] = self.stack_calls
            fired[layer] += 1
            sink.selections(layer, site.ids(output), self.mask, self.seq, self.phase)

        return hook

    def _probe_hook(self, target: RouterSite, norm: nn.Module) -> Any:
        sink, layer, router = self.sink, target.layer, target.router

        def hook(module: nn.Module, args: tuple) -> None:
            residual = args[0]
            with torch.no_grad():
                # forward(), not __call__: the probe must not fire any hook.
                normed = norm.forward(residual)
                output = router.forward(normed.reshape(-1, normed.shape[-1]))
            sink.predictions(layer, target.ids(output), self.mask)

        return hook


@contextlib.contextmanager
def capture(
    model: nn.Module,
    path: Union[str, "os.PathLike[str]", None] = None,
    *,
    trace: Union[bool, str, None] = None,
    pilot: Optional[str] = None,
    trace_cap: Optional[int] = None,
    checkpoint: Optional[float] = None,
) -> Iterator[Optional[ModelRecorder]]:
    """Record the routing of a transformers MoE ``model`` while the ``with`` block runs.

    ``path``: where the capture is written when the block ends; None lets the
    environment decide the path exactly as ``RouterHistogram.from_env``
    (nothing is recorded, nothing written and no hook installed when
    ``TURBOSPARK_ROUTER_HIST`` is unset). ``trace``: keep every pass's ids
    (None: off, or with ``path=None`` what ``TURBOSPARK_ROUTER_TRACE`` says;
    ``"stream"``: streamed to a sidecar in bounded memory, see docs/stream.md).
    ``trace_cap`` and ``checkpoint``: as ``RouterHistogram``'s (None: off,
    or with ``path=None`` what their environment variables say).
    ``pilot``: None, ``"next"`` (each routed layer predicts the next routed
    one) or ``"self"`` (the wiring self-test); with ``path=None``, None
    follows ``TURBOSPARK_PILOT_PROBE``. A ``trace`` or ``pilot`` given
    overrides the environment, so ``capture(model, trace=True)`` can stay in
    a runtime that records only when the environment asks.

    Yields the recorder (a ``RouterHistogram``), or None when recording is
    off. Layers are the model's decoder layers (dense ones stay zero rows).
    Reading the recorder's ``counts``, ``passes``, ``trace()`` or
    ``predictions()`` inside the block shows every row recorded so far.
    On exit, normal or by exception, every hook is removed, the model's own
    methods (an instance-level override included) are put back, and the
    recorder closed (the file written).

    Raises, before any recorder exists (so no file is written): ``TypeError``
    for a model whose routers cannot be found or report no chosen ids
    (naming its class and what is missing), ``ValueError`` for a bad
    ``pilot`` or ``trace``, or when the probe cannot find a routed layer's
    pre-MoE norm, ``RuntimeError`` when a capture is already running on the
    model. Inside the block, a ``generate`` call in assisted mode
    (``assistant_model=``, ``prompt_lookup_num_tokens=``, ...) raises
    ``ValueError`` naming the setting before the model runs, and so does
    beam search (``num_beams`` > 1, beam sampling, group or constrained
    beam search); with the probe
    on, the first forward call raises ``RuntimeError`` when a norm the probe
    uses does not produce exactly its router's input; any ``generate`` or
    forward call whose routers did not all run raises ``RuntimeError``; a
    router that fires twice in one forward call of the decoder stack (a
    looped or shared decoder layer) raises ``RuntimeError`` naming the
    layer, and the capture is then discarded (no file written). Models
    whose config declares looped layers (transformers'
    ``num_hidden_layers_key``, e.g. Inkling2Loop) are refused up front with
    ``TypeError``.

    ``model`` may be the wrapper ``torch.compile`` returns (the module it
    wraps is recorded); for the block, compiled calls of the model run the
    eager code they compiled (this module's docstring says why).
    """
    if pilot not in _PILOTS:
        raise ValueError(f"pilot must be None, 'next' or 'self', got {pilot!r}")
    if trace is not None and not isinstance(trace, bool) and trace != "stream":
        raise ValueError(f"trace must be None, True, False or 'stream', got {trace!r}")
    wrapper = None
    inner = _compiled_inner(model)
    if inner is not None:
        wrapper, model = model, inner
    if model in _active:
        raise RuntimeError(f"a capture is already running on this {type(model).__name__}")
    if path is None and not os.environ.get(_env.HIST):
        yield None  # recording off: no discovery, no hook, no cost
        return
    routing = find_routing(model)
    sizes = (len(routing.layers), routing.num_experts, routing.top_k)
    config = None
    if path is None:
        config = _env.config_from_env(sizes[0])
        assert config is not None  # HIST is set
        config = dataclasses.replace(
            config, trace=config.trace if trace is None else trace, pilot=config.pilot if pilot is None else pilot,
            trace_cap=config.trace_cap if trace_cap is None else trace_cap,
            checkpoint=config.checkpoint if checkpoint is None else checkpoint,
        )
        probe = _plan_probe(routing, config.pilot)
        given = frozenset(name for name, value in (("trace", trace), ("pilot", pilot)) if value is not None)
        recorder = ModelRecorder.from_config(config, *sizes, given=given)
    else:
        probe = _plan_probe(routing, pilot)
        recorder = ModelRecorder(path, *sizes, trace=trace if trace == "stream" else bool(trace), pilot=pilot,
                                 trace_cap=trace_cap, checkpoint=checkpoint)
    session: Optional[_Session] = None
    try:
        session = _Session(model, routing, recorder, probe, wrapper)
        session.install()
    except BaseException:
        # Nothing was recorded: the capture is refused, not written.
        if session is not None:
            session.remove()
        recorder.discard()
        raise
    _active.add(model)
    try:
        yield recorder
    finally:
        session.remove()
        _active.discard(model)
        if session.refused:
            recorder.discard()  # a router fired twice in one call: its passes are not one per token
        else:
            recorder.close()  # drains the sink's waiting blocks first


_CALL = nn.Module._call_impl.__code__


def _called_inside_itself(model: nn.Module) -> bool:
    """Whether this forward call of ``model`` runs inside another of its calls (then the outer one is the step).

    Read from the Python stack, not from a count kept by the hooks: a forward interrupted by an exception
    (KeyboardInterrupt included) runs no hook after it, and a count would stay raised."""
    calls = 0
    frame: Optional[types.FrameType] = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _CALL and frame.f_locals.get("self") is model:
            calls += 1
            if calls > 1:
                return True
        frame = frame.f_back
    return False


def _decoder_stack(model: nn.Module, routing: Routing) -> nn.Module:
    """The module whose forward runs the decoder layers: the nearest common ancestor of them all that is not a container."""
    paths = {id(module): path for path, module in model.named_modules()}
    parts = [paths[id(layer)].split(".") for layer in routing.layers]
    common: list[str] = []
    for names in zip(*parts):
        if len(set(names)) != 1:
            break
        common.append(names[0])
    if len(routing.layers) == 1:
        common = common[:-1]  # the one layer itself is not its own stack
    while common and isinstance(model.get_submodule(".".join(common)), (nn.ModuleList, nn.ModuleDict, nn.Sequential)):
        common.pop()
    return model.get_submodule(".".join(common)) if common else model


def _device(routing: Routing) -> torch.device:
    """Where the routers' outputs live (the first router's parameters)."""
    parameter = next(routing.sites[0].router.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _assisted_refusal(mode: Any, config: Any, mode_kwargs: dict) -> str:
    """Why ``generate`` in this mode cannot be recorded ("" when it can): assisted generation, naming its trigger."""
    from transformers.generation.configuration_utils import GenerationMode

    if mode != GenerationMode.ASSISTED_GENERATION:
        return ""
    triggers = []
    if mode_kwargs.get("assistant_model") is not None:
        triggers.append(f"assistant_model={type(mode_kwargs['assistant_model']).__name__}")
    for name in ("prompt_lookup_num_tokens", "assistant_early_exit", "use_mtp"):
        value = getattr(config, name, None)
        if value is not None and value is not False:
            triggers.append(f"{name}={value!r}")
    what = ", ".join(triggers) or "assisted generation"
    return (
        f"capture() cannot record assisted generation ({what}): the model verifies blocks of candidate "
        "tokens per step, which the capture would record as one decode token; generate without it inside capture()"
    )


def _beam_refusal(mode: Any, config: Any) -> str:
    """Why ``generate`` in this mode cannot be recorded ("" when it can): any beam method, naming its settings."""
    from transformers.generation.configuration_utils import GenerationMode

    beams = (GenerationMode.BEAM_SEARCH, GenerationMode.BEAM_SAMPLE, GenerationMode.CONSTRAINED_BEAM_SEARCH,
             GenerationMode.GROUP_BEAM_SEARCH)
    if mode not in beams:
        return ""
    triggers = [f"num_beams={getattr(config, 'num_beams', None)!r}"]
    for name, inert in (("num_beam_groups", 1), ("do_sample", False), ("constraints", None), ("force_words_ids", None)):
        value = getattr(config, name, None)
        if value is not None and value != inert:
            triggers.append(f"{name}={value!r}" if name != "constraints" else f"constraints=[{len(value)} constraint(s)]")
    return (
        f"capture() cannot record beam search ({', '.join(triggers)}): it reorders the batch rows every step (each row "
        "continues whichever beam it is handed), so the sequence tags, which follow batch rows, would follow no beam, "
        "and beams it drops would be recorded as sequences; generate with num_beams=1 inside capture()"
    )


def _compiled_inner(model: Any) -> Optional[nn.Module]:
    """The module a torch.compile wrapper (``OptimizedModule``) ``model`` holds; None for anything else."""
    # Not imported: nothing was compiled (importing dynamo here would cost a second).
    kind = getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", None)
    inner = getattr(model, "_orig_mod", None) if kind is not None and isinstance(model, kind) else None
    return inner if isinstance(inner, nn.Module) else None


def is_capturing(model: nn.Module) -> bool:
    """True while a ``capture`` runs on ``model`` (or on the module a torch.compile wrapper ``model`` wraps)."""
    inner = _compiled_inner(model)
    return (model if inner is None else inner) in _active
