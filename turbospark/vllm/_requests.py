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

A row is a prompt row when its position is below the request's prompt
length, a decode row otherwise (recomputed output tokens are decode rows of
a later attempt).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

import numpy as np

from turbospark.analysis.capture import Request

__all__ = ["RequestTable", "StepTags"]

_PROMPT, _DECODE = 0, 1


@dataclass
class _Live:
    seq: int
    prompt: int
    # The next position this request routes.
    position: int


@dataclass(frozen=True)
class StepTags:
    """One step's rows: sequence id per row, and the (start, stop, phase) runs of equal phase, in row order."""

    seq: np.ndarray
    runs: tuple[tuple[int, int, str], ...]


class RequestTable:
    """Assigns sequence ids to the rows of each step, from the step's ``SchedulerOutput``."""

    def __init__(self) -> None:
        self.entries: list[Request] = []
        self._live: dict[str, _Live] = {}
        self._attempts: dict[str, int] = {}

    def _new_seq(self, req_id: str, prompt: int, start: int) -> _Live:
        attempt = self._attempts.get(req_id, -1) + 1
        self._attempts[req_id] = attempt
        live = _Live(len(self.entries), prompt, start)
        # The entry goes in before any of its passes are recorded: a document
        # written at any moment (a checkpoint) maps every seq id it holds.
        self.entries.append(Request(live.seq, req_id, attempt, start, prompt))
        self._live[req_id] = live
        return live

    def step(self, scheduler_output: Any, order: Iterable[str]) -> StepTags:
        """The tags of one step's rows; ``order``: the runner's request order (``input_batch.req_ids``).

        Raises RuntimeError when a scheduled request is unknown (its first
        schedule was missed), which would otherwise mis-tag its rows.
        """
        for new in scheduler_output.scheduled_new_reqs:
            prompt = _prompt_length(new)
            self._new_seq(new.req_id, prompt, int(new.num_computed_tokens))
        cached = scheduler_output.scheduled_cached_reqs
        for index, req_id in enumerate(cached.req_ids):
            computed = int(cached.num_computed_tokens[index])
            live = self._live.get(req_id)
            if live is None:
                raise RuntimeError(f"turbospark: request {req_id!r} was scheduled before its first step was seen")
            if computed < live.position:
                # Resumed after preemption (or recomputed): these positions were routed before.
                self._new_seq(req_id, live.prompt, computed)
            elif computed > live.position:
                live.position = computed
        counts = scheduler_output.num_scheduled_tokens
        seq: list[int] = []
        runs: list[tuple[int, int, str]] = []
        row = 0
        for req_id in order:
            n = counts.get(req_id)
            if not n:
                continue
            live = self._live[req_id]
            first, stop = live.position, live.position + n
            seq.extend([live.seq] * n)
            # Rows below the prompt length are prompt rows; a step may cross it (recompute).
            split = min(max(live.prompt - first, 0), n)
            if split:
                _extend(runs, row, row + split, "prompt")
            if split < n:
                _extend(runs, row + split, row + n, "decode")
            live.position = stop
            row += n
        for req_id in scheduler_output.finished_req_ids:
            self._live.pop(req_id, None)
        return StepTags(np.asarray(seq, dtype=np.int64), tuple(runs))


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
