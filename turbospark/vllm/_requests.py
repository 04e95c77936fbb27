"""Per-request bookkeeping: which sequence id each routed row gets, its position, and its phase.

A *sequence* (``seq`` in the capture) is one run of consecutive positions of
one vLLM request. A request gets its first sequence when it is first
scheduled; its ``start`` is the position routing began at, which is above 0
exactly when vLLM's prefix cache supplied the first ``start`` prompt tokens
(cached tokens are never routed). It gets a new sequence (``attempt`` + 1)
whenever a step starts below the position the request had already reached:
a request preempted and resumed (or any recompute) routes those positions
again, and those passes must never read as new tokens. So within one
sequence, pass ``p`` of a layer is position ``start + p``, and every position
of a request was routed for the first time in its attempt-0 sequence or in
the first later sequence that reached past it (the ``Request`` entries say
exactly where each began).

A request that finished (``finished_req_ids``) is forgotten before the step
that reports it is tagged, as vLLM's runner forgets it: an id used again
after that (vLLM's ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1``, or an id
re-sent after an abort) is a new request, whose first sequence is attempt 0
again.

A row is a prompt row when its position is below the request's prompt
length, a decode row otherwise (recomputed output tokens are decode rows of
a later attempt).

Cost: a step is tagged by the general path (a Python pass over the step's
requests) only when its batch changed; a step that repeats the previous
one's layout (same runner order, same counts, every request decoding and at
the position the previous step left it) reuses the previous tags after a
handful of C-level list and dict comparisons, with identical results.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import add
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from turbospark.capture.reader import Request

__all__ = ["RequestTable", "StepTags"]


@dataclass
class _Live:
    seq: int
    prompt: int
    # The next position this request routes.
    position: int


@dataclass(frozen=True)
class StepTags:
    """One step's rows: sequence id per row, and the (start, stop, phase) runs of equal phase, in row order.

    ``pieces`` holds, per run, ``(start, stop, phase, seq[start:stop])``: the
    arguments every layer's ``record_batch`` of that run shares.
    """

    seq: np.ndarray
    runs: tuple[tuple[int, int, str], ...]
    pieces: tuple[tuple[int, int, str, np.ndarray], ...]


@dataclass
class _Steady:
    """The layout of the last step whose rows were all decode rows of already-known requests."""

    order: list[Optional[str]]
    counts: dict[str, int]
    cached: list[str]
    # Per ``cached`` request: the position the next step must start at to repeat this layout, and its row count.
    expected: list[int]
    steps: list[int]
    tags: StepTags


class RequestTable:
    """Assigns sequence ids to the rows of each step, from the step's ``SchedulerOutput``."""

    def __init__(self) -> None:
        self.entries: list[Request] = []
        self._live: dict[str, _Live] = {}
        self._attempts: dict[str, int] = {}
        # Set while the last steps repeated one layout; ``_live`` positions then lag (``_catch_up``).
        self._steady: Optional[_Steady] = None

    def _new_seq(self, req_id: str, prompt: int, start: int) -> _Live:
        attempt = self._attempts.get(req_id, -1) + 1
        self._attempts[req_id] = attempt
        live = _Live(len(self.entries), prompt, start)
        # The entry goes in before any of its passes are recorded: a document
        # written at any moment (a checkpoint) maps every seq id it holds.
        self.entries.append(Request(live.seq, req_id, attempt, start, prompt))
        self._live[req_id] = live
        return live

    def step(self, scheduler_output: Any, order: Sequence[Optional[str]]) -> StepTags:
        """The tags of one step's rows; ``order``: the runner's request order (``input_batch.req_ids``).

        Raises RuntimeError when a scheduled request is unknown (its first
        schedule was missed), which would otherwise mis-tag its rows.
        """
        new_reqs = scheduler_output.scheduled_new_reqs
        cached = scheduler_output.scheduled_cached_reqs
        counts = scheduler_output.num_scheduled_tokens
        steady = self._steady
        # The same layout as the last step, every request where that step left it: the same tags (the
        # general path below would compute exactly these; the comparisons are C loops).
        if (steady is not None and not new_reqs and not scheduler_output.finished_req_ids
                and cached.num_computed_tokens == steady.expected and cached.req_ids == steady.cached
                and counts == steady.counts and order == steady.order):
            steady.expected = list(map(add, steady.expected, steady.steps))
            return steady.tags
        self._catch_up()
        return self._general_step(scheduler_output, new_reqs, cached, counts, order)

    def _catch_up(self) -> None:
        """Bring ``_live`` positions up to date after steps that took the repeated-layout path."""
        steady = self._steady
        if steady is None:
            return
        self._steady = None
        live = self._live
        for req_id, position in zip(steady.cached, steady.expected):
            live[req_id].position = position

    def _general_step(self, scheduler_output: Any, new_reqs: Iterable[Any], cached: Any, counts: dict[str, int],
                      order: Sequence[Optional[str]]) -> StepTags:
        live_of = self._live
        # Finished before this step (vLLM's runner drops them first too): an id sent again after its request
        # finished (VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1, an id re-sent after an abort) is a new request.
        for req_id in scheduler_output.finished_req_ids:
            live_of.pop(req_id, None)
            self._attempts.pop(req_id, None)
        fresh = False
        for new in new_reqs:
            fresh = True
            self._new_seq(new.req_id, _prompt_length(new), int(new.num_computed_tokens))
        for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens):
            computed = int(computed)
            live = live_of.get(req_id)
            if live is None:
                raise RuntimeError(f"turbospark: request {req_id!r} was scheduled before its first step was seen")
            if computed < live.position:
                # Resumed after preemption (or recomputed): these positions were routed before.
                self._new_seq(req_id, live.prompt, computed)
            elif computed > live.position:
                live.position = computed
        seqs: list[int] = []
        lengths: list[int] = []
        runs: list[tuple[int, int, str]] = []
        row = 0
        for req_id in order:
            n = counts.get(req_id) if req_id is not None else None
            if not n:
                continue
            live = live_of[req_id]
            seqs.append(live.seq)
            lengths.append(n)
            # Rows below the prompt length are prompt rows; a step may cross it (recompute).
            split = min(max(live.prompt - live.position, 0), n)
            if split:
                _extend(runs, row, row + split, "prompt")
            if split < n:
                _extend(runs, row + split, row + n, "decode")
            live.position += n
            row += n
        seq = np.repeat(np.asarray(seqs, dtype=np.int64), lengths)
        tags = StepTags(seq, tuple(runs), tuple((a, b, phase, seq[a:b]) for a, b, phase in runs))
        if not fresh and len(runs) == 1 and runs[0][2] == "decode":
            # Every row decodes a known request: a next step with this layout gets these tags again.
            req_ids = list(cached.req_ids)
            steps = [counts.get(req_id, 0) for req_id in req_ids]
            self._steady = _Steady(list(order), dict(counts), req_ids,
                                   [live_of[req_id].position for req_id in req_ids], steps, tags)
        return tags


def _extend(runs: list[tuple[int, int, str]], start: int, stop: int, phase: str) -> None:
    if runs and runs[-1][2] == phase and runs[-1][1] == start:
        runs[-1] = (runs[-1][0], stop, phase)
    else:
        runs.append((start, stop, phase))


def _prompt_length(new: Any) -> int:
    ids: Optional[Any] = getattr(new, "prompt_token_ids", None)
    if ids is not None:
        return len(ids)
    embeds = getattr(new, "prompt_embeds", None)
    if embeds is not None:
        return int(embeds.shape[0])
    raise RuntimeError(f"turbospark: request {new.req_id!r} has neither prompt token ids nor prompt embeddings")
