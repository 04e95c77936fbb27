"""Fake vLLM scheduler outputs for the plugin's unit tests (not a test): just the fields the plugin reads."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def new(req_id: str, prompt: int, computed: int = 0) -> Any:
    return SimpleNamespace(req_id=req_id, prompt_token_ids=list(range(prompt)), num_computed_tokens=computed)


def step(counts: dict[str, int], new_reqs: tuple[Any, ...] = (), cached: tuple[tuple[str, int], ...] = (),
         finished: tuple[str, ...] = ()) -> Any:
    return SimpleNamespace(
        scheduled_new_reqs=list(new_reqs),
        scheduled_cached_reqs=SimpleNamespace(req_ids=[r for r, _ in cached], num_computed_tokens=[c for _, c in cached]),
        num_scheduled_tokens=counts,
        total_num_scheduled_tokens=sum(counts.values()),
        finished_req_ids=set(finished),
    )


def engine_steps(seed: int, count: int, chunk: int = 6) -> list[tuple[Any, list[str]]]:
    """``count`` steps of a small engine: (scheduler output, runner order) pairs.

    Requests arrive at random, prefill in chunks of at most ``chunk`` tokens
    beside other requests' decode rows, decode one token a step and finish
    after 2..6 new tokens (reported in the next step's ``finished_req_ids``,
    as vLLM does); the runner order is arrival order.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    live: dict[str, list[int]] = {}  # id -> [prompt, computed, new tokens left]
    finished: tuple[str, ...] = ()
    steps = []
    for made in range(count):
        arrivals = []
        if not live or rng.random() < 0.3:
            req_id = f"r{made}"
            live[req_id] = [int(rng.integers(3, 14)), 0, int(rng.integers(2, 7))]
            arrivals.append(new(req_id, live[req_id][0]))
        counts = {r: min(p - c, chunk) if c < p else 1 for r, (p, c, _) in live.items()}
        cached = tuple((r, live[r][1]) for r in counts if all(a.req_id != r for a in arrivals))
        steps.append((step(counts, tuple(arrivals), cached, finished), list(counts)))
        done = []
        for req_id, n in counts.items():
            state = live[req_id]
            state[1] += n
            if state[1] > state[0]:
                state[2] -= 1
                if state[2] == 0:
                    done.append(req_id)
        for req_id in done:
            del live[req_id]
        finished = tuple(done)
    return steps
