"""``verify``: check a capture against the model's own routing, recomputed by a teacher-forced forward.

The capture of a ``generate`` run holds, for each routed layer, first the
prompt block (sequence by sequence, real tokens only), then one pass per
decode step for every sequence not yet finished. Step s feeds the token
generated at step s-1; a sequence's last generated token (its EOS, the one a
``StoppingCriteria`` or stop string stopped it at, or the one that reached
the length limit) is never fed, and neither is anything after it (generate
pads a finished sequence). ``verify`` runs the model once over the final sequences with hooks
on the routers, picks the same tokens in the same order, and compares.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch
from torch import nn

from turbospark.capture.reader import Capture, load, loads
from turbospark.transformers._capture import is_capturing
from turbospark.transformers._routers import Routing, find_routing

__all__ = ["Verification", "criteria_stops", "expected_positions", "route_sequences", "verify"]


@dataclass(frozen=True)
class Verification:
    """What ``verify`` found: ``ok``, the number of ``passes`` compared, and the ``problems`` (empty when ok)."""

    ok: bool
    passes: int
    checked_trace: bool
    problems: tuple[str, ...] = field(default=())

    def __bool__(self) -> bool:
        return self.ok


def expected_positions(
    sequences: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    eos_token_ids: Sequence[int],
    stopped: Optional[Sequence[Optional[int]]] = None,
    prefill_chunk_size: Optional[int] = None,
) -> list[tuple[int, int]]:
    """(row, position) of every token the capture should hold, in recording order.

    ``attention_mask`` is the prompt's mask, (B, P) with P <= T; None means
    the whole of ``sequences`` was the prompt, unpadded. ``stopped``: per
    row, the index (0 = first generated token) of the token at which a
    stopping criterion finished it, or None (see ``criteria_stops``).
    ``prefill_chunk_size``: N when ``generate`` prefilled N prompt columns
    per call (its ``prefill_chunk_size``): the prompt block is then routed
    chunk by chunk, each chunk row by row.
    """
    batch, total = sequences.shape
    if attention_mask is None:
        attention_mask = torch.ones(batch, total, dtype=torch.long)
    prompt = attention_mask.shape[1]
    generated = total - prompt
    fed = []
    for row in range(batch):
        tail = sequences[row, prompt:].tolist()
        stops = [i for i, token in enumerate(tail) if token in eos_token_ids]
        stop = None if stopped is None else stopped[row]
        if stop is not None:
            stops.append(int(stop))
        fed.append(min(min(stops) if stops else generated - 1, generated - 1) if generated else 0)
    chunk = prompt if not prefill_chunk_size else int(prefill_chunk_size)
    order = [(row, p) for start in range(0, prompt, max(chunk, 1)) for row in range(batch)
             for p in range(start, min(start + chunk, prompt)) if attention_mask[row, p]]
    for step in range(max(fed, default=0)):
        order.extend((row, prompt + step) for row in range(batch) if step < fed[row])
    return order


def criteria_stops(criteria: Any, sequences: torch.Tensor, prompt: int) -> list[Optional[int]]:
    """Per row, the first generated index at which ``criteria`` (generate's rule, replayed) finish it, or None.

    ``criteria`` is called as generate calls it after each step, on the
    sequences up to and including that step's token, with ``scores=None``
    (criteria that read the scores cannot be replayed).
    """
    batch, total = sequences.shape
    found: list[Optional[int]] = [None] * batch
    for step in range(total - prompt):
        done = torch.as_tensor(criteria(sequences[:, : prompt + step + 1], None)).reshape(-1).to("cpu")
        if done.numel() == 1 and batch != 1:
            done = done.expand(batch)
        if done.numel() != batch:
            raise ValueError(f"the stopping criteria returned {done.numel()} verdicts for a batch of {batch}")
        for row in range(batch):
            if found[row] is None and bool(done[row]):
                found[row] = step
        if all(stop is not None for stop in found):
            break
    return found


def _stopping_criteria(criteria: Any, stop_strings: Any, tokenizer: Any) -> Any:
    """generate's criteria from the arguments generate takes (None when none given)."""
    from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList, StopStringCriteria

    if stop_strings is not None and tokenizer is None:
        raise ValueError(f"stop_strings={stop_strings!r} needs the tokenizer generate was given: pass tokenizer=")
    found = StoppingCriteriaList()
    if criteria is not None:
        items = [criteria] if isinstance(criteria, StoppingCriteria) else list(criteria)
        for item in items:
            if not callable(item):
                raise TypeError(f"stopping_criteria must hold StoppingCriteria, got {type(item).__name__}")
        found.extend(items)
    if stop_strings is not None:
        found.append(StopStringCriteria(tokenizer, stop_strings))
    return found or None


def _padding_hint(sequences: torch.Tensor, prompt: int, model: nn.Module, eos_ids: Sequence[int]) -> list[str]:
    """A hint when a row ends in padding with no EOS before it: generate stopped it some other way."""
    pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    if pad is None or pad in eos_ids or sequences.shape[1] <= prompt:
        return []
    rows = [row for row in range(sequences.shape[0])
            if int(sequences[row, -1]) == pad and not any(t in eos_ids for t in sequences[row, prompt:].tolist())]
    if not rows:
        return []
    return [f"sequence(s) {rows} end in padding (token {pad}) with no EOS: if generate stopped them with a "
            "StoppingCriteria or stop strings, pass the same stopping_criteria=, or stop_strings= and tokenizer=, to verify"]


def _chunk_size(model: nn.Module, given: Optional[int]) -> Optional[int]:
    """The prefill chunk size ``generate`` used: ``given``, else the model's generation_config's."""
    if given is None:
        given = getattr(getattr(model, "generation_config", None), "prefill_chunk_size", None)
        if given is None:
            return None
    if isinstance(given, bool) or not isinstance(given, int) or given < 1:
        raise ValueError(f"prefill_chunk_size must be a positive integer, got {given!r}")
    return given


def _chunk_hint(captured: Capture) -> list[str]:
    """A hint when the prompt passes go back to an earlier sequence: generate prefilled in chunks."""
    if captured.seq is None or captured.phase is None:
        return []
    for seq, phase in zip(captured.seq, captured.phase):
        prompt = np.asarray(seq)[np.asarray(phase) == 0]
        if prompt.size > 1 and bool((np.diff(prompt) < 0).any()):
            return ["the prompt passes return to earlier sequences, as when generate prefills in chunks: "
                    "pass the same prefill_chunk_size= to verify"]
    return []


def _check_sequences(captured: Capture, layer: int, order: list[tuple[int, int]], prompt: int) -> list[str]:
    """The pass's sequence and phase, when the capture has them: rows in order, prompt positions phase 0."""
    if captured.seq is None or captured.phase is None or captured.trace is None:
        return []
    seq, phase = captured.seq[layer], captured.phase[layer]
    if seq.shape[0] != len(order):
        return []  # the pass-count problem is reported already
    rows = np.array([row for row, _ in order], dtype=np.int64)
    want_phase = np.array([0 if col < prompt else 1 for _, col in order], dtype=np.int64)
    problems = []
    base = int(seq.min()) if seq.size else 0
    if not np.array_equal(seq - base, rows):
        problems.append(f"layer {layer}: the passes' sequence ids are not the batch rows in recording order")
    if not np.array_equal(phase, want_phase):
        problems.append(f"layer {layer}: prompt/decode phases differ from the prompt length {prompt}")
    return problems


def route_sequences(
    model: nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, routing: Optional[Routing] = None
) -> dict[int, torch.Tensor]:
    """Each routed layer's chosen ids for every token of a teacher-forced forward: {layer: (B, T, top_k)}.

    Position ids follow ``generate``'s rule (cumulative sum of the mask), so
    left-padded rows see the positions they saw during generation.
    """
    routing = routing or find_routing(model)
    batch, total = sequences.shape
    found: dict[int, torch.Tensor] = {}
    hooks = []
    for site in routing.sites:
        def hook(module: nn.Module, args: tuple, output: Any, site: Any = site) -> None:
            found[site.layer] = site.ids(output).detach().to("cpu").reshape(batch, total, site.top_k)

        hooks.append(site.router.register_forward_hook(hook))
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            model(
                input_ids=sequences.to(device),
                attention_mask=attention_mask.to(device),
                position_ids=positions.to(device),
                use_cache=False,
            )
    finally:
        for handle in hooks:
            handle.remove()
    return found


def _as_capture(capture: Any) -> Capture:
    if isinstance(capture, Capture):
        return capture
    if isinstance(capture, (str, os.PathLike)):
        return load(capture)
    if hasattr(capture, "to_json"):
        return loads(capture.to_json())
    raise TypeError(f"capture must be a Capture, a path or a RouterHistogram, got {type(capture).__name__}")


def _eos_ids(model: nn.Module, eos_token_id: Union[int, Sequence[int], None]) -> list[int]:
    if eos_token_id is None:
        config = getattr(model, "generation_config", None)
        eos_token_id = getattr(config, "eos_token_id", None)
    if eos_token_id is None:
        return []
    return [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]


def verify(
    model: nn.Module,
    capture: Any,
    sequences: torch.Tensor,
    attention_mask: Optional[torch.Tensor] = None,
    *,
    eos_token_id: Union[int, Sequence[int], None] = None,
    stopping_criteria: Any = None,
    stop_strings: Union[str, Sequence[str], None] = None,
    tokenizer: Any = None,
    prefill_chunk_size: Optional[int] = None,
) -> Verification:
    """Check that ``capture`` holds exactly ``model``'s routing of ``sequences``.

    Takes the model, the capture (a ``Capture``, a path, or the recorder
    ``capture()`` yielded), the sequences ``generate`` returned (B, T) or the
    input of a plain forward, and the prompt's ``attention_mask`` (B, P),
    P <= T, or None for an unpadded prompt of the whole width. EOS ids come
    from ``eos_token_id`` or the model's ``generation_config``. When
    ``generate`` was given ``stopping_criteria`` or ``stop_strings`` (with a
    ``tokenizer``), pass the same here: they are replayed on the sequences
    (``criteria_stops``) to find where each row stopped. So with
    ``prefill_chunk_size`` (default: the model's ``generation_config``'s):
    the prompt was routed chunk by chunk, and the capture holds it in that
    order.

    Returns a ``Verification``: ok when every layer's counts equal the
    recomputed routes' counts and, with a trace, every pass's set of ids
    equals the recomputed one, in order (dense layers must stay empty), and
    when the capture tags passes with sequences and phases, each pass carries
    its batch row (offset by the capture's first sequence id) and phase.
    Raises ``RuntimeError`` while a capture is running on the model (its
    hooks would record this forward), ``TypeError`` for an unsupported model
    or capture, ``ValueError`` when the mask does not fit the sequences or
    ``stop_strings`` come without a ``tokenizer`` or ``prefill_chunk_size``
    is not a positive integer.
    """
    if is_capturing(model):
        raise RuntimeError("verify() runs a forward pass: call it after the capture's with-block has ended")
    criteria = _stopping_criteria(stopping_criteria, stop_strings, tokenizer)
    captured = _as_capture(capture)
    sequences = torch.as_tensor(sequences).to("cpu")
    if sequences.dim() != 2:
        raise ValueError(f"sequences must be (batch, length), got shape {tuple(sequences.shape)}")
    prompt_mask = None if attention_mask is None else torch.as_tensor(attention_mask).to("cpu")
    if prompt_mask is not None and (prompt_mask.dim() != 2 or prompt_mask.shape[0] != sequences.shape[0] or prompt_mask.shape[1] > sequences.shape[1]):
        raise ValueError(
            f"attention_mask must be the prompt's mask, (batch, prompt length <= {sequences.shape[1]}), "
            f"got shape {tuple(prompt_mask.shape)}"
        )
    full_mask = torch.ones_like(sequences)
    if prompt_mask is not None:
        full_mask[:, : prompt_mask.shape[1]] = prompt_mask
    prompt_width = sequences.shape[1] if prompt_mask is None else prompt_mask.shape[1]
    routing = find_routing(model)
    routes = route_sequences(model, sequences, full_mask, routing)
    eos_ids = _eos_ids(model, eos_token_id)
    stopped = None if criteria is None else criteria_stops(criteria, sequences, prompt_width)
    chunk = _chunk_size(model, prefill_chunk_size)
    order = expected_positions(sequences, prompt_mask, eos_ids, stopped, chunk)
    rows = torch.tensor([row for row, _ in order], dtype=torch.long)
    cols = torch.tensor([col for _, col in order], dtype=torch.long)
    problems = []
    num_layers = len(routing.layers)
    if captured.num_layers != num_layers:
        problems.append(f"capture has {captured.num_layers} layers, the model {num_layers}")
    for layer in range(min(captured.num_layers, num_layers)):
        expected = routes[layer][rows, cols].numpy() if layer in routes else np.zeros((0, captured.top_k), np.int64)
        counts = np.bincount(expected.reshape(-1), minlength=captured.num_experts)[: captured.num_experts]
        if not np.array_equal(captured.counts[layer], counts):
            problems.append(f"layer {layer}: counts differ ({int(captured.counts[layer].sum())} ids captured, {expected.size} expected)")
        if captured.trace is None:
            continue
        got = captured.trace[layer]
        if got.shape[0] != expected.shape[0]:
            problems.append(f"layer {layer}: {got.shape[0]} passes captured, {expected.shape[0]} expected")
            continue
        if layer in routes:
            problems.extend(_check_sequences(captured, layer, order, prompt_width))
        differ = np.nonzero((np.sort(got, axis=1) != np.sort(expected, axis=1)).any(axis=1))[0]
        for index in differ[:3]:
            row, col = order[index]
            problems.append(
                f"layer {layer}, pass {index} (sequence {row}, position {col}): captured {sorted(got[index].tolist())}, "
                f"the model routes {sorted(expected[index].tolist())}"
            )
    if problems and criteria is None:
        problems.extend(_padding_hint(sequences, prompt_width, model, eos_ids))
    if problems and chunk is None:
        problems.extend(_chunk_hint(captured))
    return Verification(not problems, len(order), captured.trace is not None, tuple(problems))
