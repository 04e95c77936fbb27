"""The order torch's default CPU sort gives equal loads: libstdc++'s ``std::sort``, step for step.

The published EPLB sorts loads with ``tensor.sort(descending=True)``, which
on CPU (torch 2.x, Linux) runs ``std::sort`` on (value, index) pairs compared
by value only. ``std::sort`` is an introsort (median-of-three quicksort down
to runs of 16, a heapsort past 2 log2(n) levels, then one insertion sort),
so equal values come out in an order that depends on the whole row, not in
index order. To reproduce the published placement exactly, ties included,
this module replays that algorithm (GCC's ``bits/stl_algo.h`` and
``bits/stl_heap.h``) on Python lists. Rows without repeated values skip it:
any correct sort orders them the same.
"""

from __future__ import annotations

import numpy as np

__all__ = ["argsort_desc"]

_THRESHOLD = 16


def argsort_desc(values: np.ndarray, labels: np.ndarray | None = None) -> np.ndarray:
    """Per row of a 2-D array, the indices in the order ``std::sort`` with ``a > b`` leaves them.

    ``labels`` (same shape, optional): when equal values that share a label
    are interchangeable for the caller (replicas of one expert), only rows
    where equal values carry different labels are replayed; the others keep
    a stable order, which differs from torch's only among interchangeable items.
    """
    if labels is None:
        labels = np.broadcast_to(np.arange(values.shape[1]), values.shape)
    order = np.argsort(-values, axis=1, kind="stable")
    ordered = np.take_along_axis(values, order, axis=1)
    tied = ordered[:, 1:] == ordered[:, :-1]
    if tied.any():
        # A tie class matters when it holds two labels: sort each row by (value, label)
        # and look for equal neighbours with different labels.
        by_label = _lexsort_rows(values, labels)
        v = np.take_along_axis(values, by_label, axis=1)
        lab = np.take_along_axis(labels, by_label, axis=1)
        tied = (v[:, 1:] == v[:, :-1]) & (lab[:, 1:] != lab[:, :-1])
    for row in np.flatnonzero(tied.any(axis=1)):
        order[row] = _std_sort(values[row].tolist())
    return order


def _lexsort_rows(values: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per row, indices sorted by value descending, then label."""
    by_label = np.argsort(labels, axis=1, kind="stable")
    by_value = np.argsort(-np.take_along_axis(values, by_label, axis=1), axis=1, kind="stable")
    return np.take_along_axis(by_label, by_value, axis=1)


def _std_sort(keys: list[float]) -> list[int]:
    items = [(value, index) for index, value in enumerate(keys)]
    n = len(items)
    if n > 1:
        _introsort_loop(items, 0, n, 2 * (n.bit_length() - 1))
        _final_insertion_sort(items, 0, n)
    return [index for _, index in items]


def _introsort_loop(a: list, first: int, last: int, depth: int) -> None:
    while last - first > _THRESHOLD:
        if depth == 0:
            _heap_sort(a, first, last)
            return
        depth -= 1
        mid = first + (last - first) // 2
        _move_median_to_first(a, first, first + 1, mid, last - 1)
        cut = _unguarded_partition(a, first + 1, last, first)
        _introsort_loop(a, cut, last, depth)
        last = cut


def _move_median_to_first(a: list, result: int, x: int, y: int, z: int) -> None:
    ax, ay, az = a[x][0], a[y][0], a[z][0]
    # comp(p, q) is "p > q": descending order.
    if ax > ay:
        pick = y if ay > az else (z if ax > az else x)
    elif ax > az:
        pick = x
    elif ay > az:
        pick = z
    else:
        pick = y
    a[result], a[pick] = a[pick], a[result]


def _unguarded_partition(a: list, first: int, last: int, pivot: int) -> int:
    p = a[pivot][0]
    while True:
        while a[first][0] > p:
            first += 1
        last -= 1
        while p > a[last][0]:
            last -= 1
        if not first < last:
            return first
        a[first], a[last] = a[last], a[first]
        first += 1


def _final_insertion_sort(a: list, first: int, last: int) -> None:
    if last - first > _THRESHOLD:
        _insertion_sort(a, first, first + _THRESHOLD)
        for i in range(first + _THRESHOLD, last):
            _unguarded_linear_insert(a, i)
    else:
        _insertion_sort(a, first, last)


def _insertion_sort(a: list, first: int, last: int) -> None:
    for i in range(first + 1, last):
        if a[i][0] > a[first][0]:
            value = a[i]
            a[first + 1 : i + 1] = a[first:i]
            a[first] = value
        else:
            _unguarded_linear_insert(a, i)


def _unguarded_linear_insert(a: list, last: int) -> None:
    value = a[last]
    nxt = last - 1
    while value[0] > a[nxt][0]:
        a[last] = a[nxt]
        last = nxt
        nxt -= 1
    a[last] = value


def _heap_sort(a: list, first: int, last: int) -> None:
    # std::__partial_sort(first, last, last): make_heap, then sort_heap.
    length = last - first
    if length >= 2:
        parent = (length - 2) // 2
        while True:
            _adjust_heap(a, first, parent, length, a[first + parent])
            if parent == 0:
                break
            parent -= 1
    while last - first > 1:
        last -= 1
        value = a[last]
        a[last] = a[first]
        _adjust_heap(a, first, 0, last - first, value)


def _adjust_heap(a: list, first: int, hole: int, length: int, value: tuple) -> None:
    top = hole
    child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if a[first + child][0] > a[first + child - 1][0]:  # comp(child, child - 1)
            child -= 1
        a[first + hole] = a[first + child]
        hole = child
    if length % 2 == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        a[first + hole] = a[first + child - 1]
        hole = child - 1
    parent = (hole - 1) // 2
    while hole > top and a[first + parent][0] > value[0]:  # comp(parent, value)
        a[first + hole] = a[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    a[first + hole] = value
