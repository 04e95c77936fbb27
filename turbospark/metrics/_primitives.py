"""The set primitives of the trace metrics, below both the metrics (``layers.py``) and their numpy twin.

Each pass's set S_p is a row of 64-bit words (expert e is bit e % 64 of word
e // 64), so duplicates within a pass vanish by construction and
intersections, unions and sizes are a few whole-array AND / OR / popcount
operations instead of one Python set per pass. ``layers.py`` builds the
public metrics on them and ``_metrics_py.py`` (the kernel's reference twin)
its integer sums; neither imports the other.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["lru_stack_distances", "pass_bitsets"]


def pass_bitsets(ids: np.ndarray, num_experts: int) -> np.ndarray:
    """The sets S_p of a (P, K) id array as a (P, ceil(E / 64)) uint64 bitset array."""
    position = _position_bits(ids, num_experts)
    bits = np.zeros((ids.shape[0], position.shape[2]), dtype=np.uint64)
    # K is small: K whole-column ORs beat a strided reduce over axis 1.
    for i in range(ids.shape[1]):
        bits |= position[:, i]
    return bits


def _position_bits(ids: np.ndarray, num_experts: int) -> np.ndarray:
    """(P, K, W) uint64: entry [p, i] is the one-expert bitset of ids[p, i]."""
    words = max(1, -(-num_experts // 64))
    onehot = np.left_shift(np.uint64(1), (ids % 64).astype(np.uint64))
    if words == 1:
        return onehot[:, :, None]
    word = ids // 64
    zero = np.uint64(0)
    return np.stack([np.where(word == w, onehot, zero) for w in range(words)], axis=2)


class _Spans:
    """Sparse table of pass unions: ``level(j)[s]`` = S_s | ... | S_(s + 2^j - 1).

    Union is idempotent, so any run of passes is the OR of the two
    (overlapping) power-of-two spans at its ends: O(P log P) words to build,
    O(1) per query.
    """

    def __init__(self, bits: np.ndarray) -> None:
        self._levels = [bits]

    def level(self, j: int) -> np.ndarray:
        while len(self._levels) <= j:
            half = 1 << (len(self._levels) - 1)
            last = self._levels[-1]
            self._levels.append(last[:-half] | last[half:])
        return self._levels[j]

    def union(self, start: np.ndarray, length: np.ndarray) -> np.ndarray:
        """Bitsets of the unions of passes start .. start + length - 1 (length >= 0)."""
        passes, words = self._levels[0].shape
        nonempty = length > 0
        longest = int(length.max(initial=0))
        if longest == 0:
            return np.zeros((start.shape[0], words), dtype=np.uint64)
        # All levels in one zero-padded (levels * P, W) table, so every query
        # is two row gathers whatever its level; length 0 reads a zero row.
        top = longest.bit_length() - 1
        table = np.zeros(((top + 1) * passes + 1, words), dtype=np.uint64)
        for j in range(top + 1):
            level = self.level(j)
            table[j * passes : j * passes + level.shape[0]] = level
        zero_row = (top + 1) * passes
        j = np.frexp(np.maximum(length, 1).astype(np.float64))[1] - 1  # floor(log2)
        base = j * passes
        first = np.where(nonempty, base + start, zero_row)
        second = np.where(nonempty, base + start + length - (1 << j), zero_row)
        return np.take(table, first, axis=0) | np.take(table, second, axis=0)


def _popcount(bits: np.ndarray) -> np.ndarray:
    """Set bits per row of a (N, W) uint64 array, as int64 (N,)."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(bits).sum(axis=1, dtype=np.int64)
    as_bytes = np.ascontiguousarray(bits).view(np.uint8).reshape(bits.shape[0], -1)
    return _BYTE_POPCOUNT[as_bytes].sum(axis=1, dtype=np.int64)


_BYTE_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)


def _window_totals(bits: np.ndarray, windows: Sequence[int]) -> dict[int, tuple[int, int]]:
    """{M: (sum of the union sizes, number of windows)} over the windows of M consecutive passes."""
    passes = bits.shape[0]
    spans = _Spans(bits)
    result: dict[int, tuple[int, int]] = {}
    for m in windows:
        if m > passes:
            result[m] = (0, 0)
            continue
        count = passes - m + 1
        j = m.bit_length() - 1
        table = spans.level(j)
        union = table[:count] | table[m - (1 << j) :][:count]
        result[m] = (int(_popcount(union).sum()), count)
    return result


def lru_stack_distances(ids: np.ndarray, num_experts: int) -> np.ndarray:
    """LRU stack distance of every lookup of a (P, K) trace, in lookup order.

    A lookup is each pass's distinct ids in trace order; its distance is the
    number of other experts looked up since this expert's previous lookup,
    or -1 for a first lookup. Takes the trace and E; returns a 1-D int64 array.

    For a lookup of x at (pass p, position i) whose previous lookup was at
    (q, j), the experts used since are: the rest of pass q after position j,
    all of passes q+1 .. p-1, and pass p before position i -- a union of
    three bitsets (one from the sparse table), so every lookup is answered
    at once without replaying the cache.
    """
    passes, k = ids.shape
    if passes == 0 or k == 0:
        return np.zeros(0, dtype=np.int64)
    # prefix[p, i] = set of ids at positions < i of pass p, flattened to rows
    # p * (k + 1) + i so that every gather below is a single row take.
    position = _position_bits(ids, num_experts)
    words = position.shape[2]
    prefix = np.zeros((passes, k + 1, words), dtype=np.uint64)
    np.bitwise_or.accumulate(position, axis=1, out=prefix[:, 1:])
    # A pass's lookups are its distinct ids: the entries not already in the prefix.
    first = ~(prefix[:, :k] & position).any(axis=2)
    rows = prefix.reshape(passes * (k + 1), words)
    lookup_pass, lookup_pos = np.nonzero(first)  # row-major: trace order
    expert = ids[lookup_pass, lookup_pos]
    # Previous lookup of the same expert: neighbours in a stable sort by expert.
    order = np.argsort(expert.astype(np.int16 if num_experts <= 2**15 else np.int64), kind="stable")
    same = expert[order[1:]] == expert[order[:-1]]
    previous = np.full(expert.shape[0], -1, dtype=np.int64)
    previous[order[1:][same]] = order[:-1][same]
    again = np.nonzero(previous >= 0)[0]
    p, i = lookup_pass[again], lookup_pos[again]
    q, j = lookup_pass[previous[again]], lookup_pos[previous[again]]
    stride = k + 1
    whole_q = np.take(rows, q * stride + k, axis=0)
    through_j = np.take(rows, q * stride + j + 1, axis=0)
    before_i = np.take(rows, p * stride + i, axis=0)
    between = _Spans(prefix[:, k]).union(q + 1, p - q - 1)
    since = (whole_q & ~through_j) | between | before_i
    distance = np.full(expert.shape[0], -1, dtype=np.int64)
    distance[again] = _popcount(since)
    return distance
