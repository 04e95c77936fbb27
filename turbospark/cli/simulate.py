"""A synthetic Mixture-of-Experts router, for the demo and the benchmarks.

It imitates the properties of real decode-time routing that the analysis
measures, so that every number in the report has something to show:

* per-layer skewed expert popularity (a Zipf-like prior, shuffled per layer,
  so no two layers favour the same experts);
* pass-to-pass reuse (experts picked in the previous pass get a logit bonus,
  as consecutive tokens of one text tend to route alike);
* a one-layer-ahead predictor that is right most of the time (it ranks the
  next layer's experts on slightly perturbed logits, as a probe run on the
  previous layer's residual would);
* optionally, drift (``RoutingParams.drift`` = D): every D passes each
  layer's popularity is shuffled again, so the hot experts move (a change of
  traffic, as when a new kind of request arrives), for the rebalancing tools.

Routing is a Gumbel-top-k over those logits, which yields distinct ids per
pass ordered by score, like a real router's top-k.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np


@dataclass(frozen=True)
class RoutingParams:
    """Knobs of the synthetic router; the defaults give realistic-looking numbers.

    ``skew``: Zipf exponent of the per-layer expert popularity (0 = uniform).
    ``stickiness``: logit bonus for experts chosen in the previous pass.
    ``noise``: scale of the Gumbel noise that makes each pass differ.
    ``predictor_noise``: extra logit noise seen by the one-layer-ahead
    predictor; 0 makes it exact.
    ``drift``: passes between reshuffles of each layer's popularity (0: never).
    """

    skew: float = 1.0
    stickiness: float = 1.2
    noise: float = 1.0
    predictor_noise: float = 0.35
    drift: int = 0


@dataclass(frozen=True)
class Pass:
    """One decode pass: ``selected[l]`` is layer l's top-k, ``predicted[l]``
    the prediction for layer l made while layer l-1 ran (row 0 is unused)."""

    selected: np.ndarray  # (num_layers, top_k) int64
    predicted: np.ndarray  # (num_layers, top_k) int64


class RouterSimulator:
    """Generates decode passes of a synthetic MoE model, one pass at a time.

    Takes the model shape, a seed and optional ``RoutingParams``; raises
    ``ValueError`` when ``top_k`` is not in 1..num_experts or a size is < 1.
    """

    def __init__(
        self,
        num_layers: int,
        num_experts: int,
        top_k: int,
        *,
        seed: int = 0,
        params: RoutingParams | None = None,
    ) -> None:
        if num_layers < 1 or num_experts < 1:
            raise ValueError("num_layers and num_experts must be at least 1")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in 1..{num_experts}, got {top_k}")
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.top_k = top_k
        self.params = params or RoutingParams()
        self._rng = np.random.default_rng(seed)
        log_ranks = np.log(np.arange(1, num_experts + 1, dtype=np.float64))
        # Each layer has its own favourite experts (a shuffle) and its own
        # degree of concentration (skew varies +-40% around the setting).
        skews = self.params.skew * self._rng.uniform(0.6, 1.4, size=num_layers)
        self._prior = np.stack([self._rng.permutation(-s * log_ranks) for s in skews])
        self._previous: np.ndarray | None = None
        self._passes = 0
        if self.params.drift < 0:
            raise ValueError(f"drift must be 0 or more passes, got {self.params.drift}")

    def step(self) -> Pass:
        """Route one decode pass through every layer; returns a ``Pass``."""
        p = self.params
        L, E, K = self.num_layers, self.num_experts, self.top_k
        if p.drift and self._passes and self._passes % p.drift == 0:
            # A separate generator: the routing before the first reshuffle is the undrifted one.
            shuffle = np.random.default_rng([self._passes, L, E])
            self._prior = np.stack([shuffle.permutation(row) for row in self._prior])
        self._passes += 1
        logits = self._prior + p.noise * self._rng.gumbel(size=(L, E))
        if self._previous is not None:
            np.put_along_axis(
                logits, self._previous, np.take_along_axis(logits, self._previous, 1) + p.stickiness, 1
            )
        selected = _top_k(logits, K)
        probe = logits + p.predictor_noise * self._rng.standard_normal((L, E))
        predicted = _top_k(probe, K)
        self._previous = selected
        return Pass(selected, predicted)

    def passes(self, count: int) -> Iterator[Pass]:
        """Yield ``count`` consecutive passes."""
        for _ in range(count):
            yield self.step()

    def run(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Route ``count`` passes; returns (selected, predicted), each shaped
        (num_layers, count, top_k), for bulk recording."""
        selected = np.empty((self.num_layers, count, self.top_k), dtype=np.int64)
        predicted = np.empty_like(selected)
        for index, one in enumerate(self.passes(count)):
            selected[:, index] = one.selected
            predicted[:, index] = one.predicted
        return selected, predicted


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Row-wise indices of the k largest scores, best first."""
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, 1), axis=1, kind="stable")
    return np.take_along_axis(part, order, 1)
