# Per-layer trace metrics of `analyze` as exact integer sums, one pass at a
# time, reading the trace in its own id width (uint8/uint16/uint32/int64).
# The pure-Python twin, turbospark/metrics/_metrics_py.py, is the reference
# this must match exactly; turbospark/metrics/trace_sums.py turns the sums
# into the report's floats, the same way for both.
#
# State per run (a sequence's passes, or a whole untagged layer) is O(E):
#   last[e]   clock of the last pass of the current run that held e (< t0:
#             not yet in this run); clocks increase across runs, so nothing
#             is reset between runs.
#   gap hist  per distinct (pass, expert): g = passes since e's previous
#             pass in the run (p + 1 for a first one), capped at max window.
#             The windows of M holding that occurrence as their first of e
#             number min(g, M), so sum over occurrences of min(g, M) is the
#             sum of the union sizes of every window of M starting in the
#             run, the last M - 1 of them cut short by its end; those are
#             subtracted at the end of the run from the last passes (ring).
#   LRU       one move-to-front stack of min(max cache, E) experts: a hit
#             at depth d hits every cache larger than d.
# Reuse and pilot ratios a/b (a <= b <= min(K, E)) are counted per (a, b),
# so their float sums can be rebuilt exactly whatever the summation order.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memset

cimport numpy as cnp
import numpy as np

cnp.import_array()

ctypedef fused id_t:
    uint8_t
    uint16_t
    uint32_t
    int64_t

_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.int64))


cdef inline int64_t _pred_id(const char* base, int code, int64_t at) noexcept nogil:
    # Predictions are read once per pass, so a switch on the width is cheap here.
    if code == 0:
        return (<const uint8_t*>base)[at]
    if code == 1:
        return (<const uint16_t*>base)[at]
    if code == 2:
        return (<const uint32_t*>base)[at]
    return (<const int64_t*>base)[at]


cdef int _code(cnp.ndarray a) except -1:
    cdef object dt = a.dtype
    for i in range(4):
        if dt == _DTYPES[i]:
            return i
    raise TypeError(f"ids must be uint8, uint16, uint32 or int64, got {dt}")


cdef class RunSums:
    """Exact integer sums of one layer's trace metrics, fed pass by pass (see trace_sums.py).

    ``RunSums(num_experts, top_k, windows, max_cache)``; ``feed`` continues
    the current run with consecutive passes, ``end_run`` closes it,
    ``add_runs`` adds whole runs given as pass indices, ``sums`` returns the
    totals. Raises ValueError for ids outside 0..E-1 or a wrong width.
    """

    cdef int64_t E, K, D, mmax, cap, nwin, rsize
    cdef int64_t* windows
    cdef int64_t* last
    cdef int64_t* pmark
    cdef int64_t clock, t0, p
    cdef int64_t* gap
    cdef int64_t* tail
    cdef int64_t* win_total
    cdef int64_t* win_count
    cdef int64_t* reuse
    cdef int64_t* pilot
    cdef int64_t exact, aligned
    cdef int32_t* ring
    cdef int64_t* ringn
    cdef int32_t* stack
    cdef uint8_t* in_stack
    cdef int64_t depth
    cdef int64_t* hits
    cdef int64_t lookups
    cdef int64_t* counts

    def __cinit__(self, int64_t num_experts, int64_t top_k, windows, int64_t max_cache):
        cdef list ws = sorted({int(w) for w in windows})
        if ws and ws[0] < 1:
            raise ValueError(f"window size must be at least 1, got {ws[0]}")
        if num_experts < 0 or top_k < 0 or max_cache < 0:
            raise ValueError("num_experts, top_k and max_cache must be non-negative")
        self.E = num_experts
        self.K = top_k
        self.D = min(top_k, num_experts)
        self.nwin = len(ws)
        self.mmax = ws[len(ws) - 1] if ws else 1
        self.rsize = self.mmax - 1
        self.cap = min(max_cache, num_experts)
        cdef int64_t n = self.E + 1, d2 = (self.D + 1) * (self.D + 1)
        self.windows = <int64_t*>calloc(self.nwin + 1, sizeof(int64_t))
        self.win_total = <int64_t*>calloc(self.nwin + 1, sizeof(int64_t))
        self.win_count = <int64_t*>calloc(self.nwin + 1, sizeof(int64_t))
        self.last = <int64_t*>malloc(n * sizeof(int64_t))
        self.pmark = <int64_t*>malloc(n * sizeof(int64_t))
        self.counts = <int64_t*>calloc(n, sizeof(int64_t))
        self.gap = <int64_t*>calloc(self.mmax + 2, sizeof(int64_t))
        self.tail = <int64_t*>calloc(self.mmax + 2, sizeof(int64_t))
        self.reuse = <int64_t*>calloc(d2, sizeof(int64_t))
        self.pilot = <int64_t*>calloc(d2, sizeof(int64_t))
        self.ring = <int32_t*>malloc((self.rsize * self.D + 1) * sizeof(int32_t))
        self.ringn = <int64_t*>calloc(self.rsize + 1, sizeof(int64_t))
        self.stack = <int32_t*>malloc((self.cap + 1) * sizeof(int32_t))
        self.in_stack = <uint8_t*>calloc(n, sizeof(uint8_t))
        self.hits = <int64_t*>calloc(self.cap + 1, sizeof(int64_t))
        if (not self.windows or not self.win_total or not self.win_count or not self.last or not self.pmark
                or not self.counts or not self.gap or not self.tail or not self.reuse or not self.pilot
                or not self.ring or not self.ringn or not self.stack or not self.in_stack or not self.hits):
            raise MemoryError()
        for i in range(self.nwin):
            self.windows[i] = ws[i]
        for i in range(n):
            self.last[i] = -1
            self.pmark[i] = -1

    def __dealloc__(self):
        free(self.windows); free(self.win_total); free(self.win_count); free(self.last); free(self.pmark)
        free(self.counts); free(self.gap); free(self.tail); free(self.reuse); free(self.pilot)
        free(self.ring); free(self.ringn); free(self.stack); free(self.in_stack); free(self.hits)

    cdef int _check(self, cnp.ndarray ids, object pred) except -1:
        if ids.ndim != 2 or ids.shape[1] != self.K:
            raise ValueError(f"ids must be (passes, {self.K}), got shape {(<object>ids).shape}")
        if not cnp.PyArray_IS_C_CONTIGUOUS(ids):
            raise ValueError("ids must be C-contiguous")
        if pred is not None:
            if pred.ndim != 2 or not cnp.PyArray_IS_C_CONTIGUOUS(pred):
                raise ValueError("pred must be a C-contiguous 2-D array")
        return 0

    def feed(self, cnp.ndarray ids, pred=None):
        """Continue the current run with the passes ``ids`` (P, K); row i of ``pred`` is pass i's prediction."""
        self._check(ids, pred)
        cdef int code = _code(ids)
        if code == 0:
            self._passes(<const uint8_t*>cnp.PyArray_DATA(ids), NULL, 0, ids.shape[0], pred)
        elif code == 1:
            self._passes(<const uint16_t*>cnp.PyArray_DATA(ids), NULL, 0, ids.shape[0], pred)
        elif code == 2:
            self._passes(<const uint32_t*>cnp.PyArray_DATA(ids), NULL, 0, ids.shape[0], pred)
        else:
            self._passes(<const int64_t*>cnp.PyArray_DATA(ids), NULL, 0, ids.shape[0], pred)

    def end_run(self):
        """Close the current run: its windows are counted, its cache emptied."""
        self._end_run()

    def add_runs(self, cnp.ndarray ids, pred, cnp.ndarray order, cnp.ndarray starts):
        """Whole runs: passes ``ids[order[starts[r]:starts[r + 1]]]`` form run r (the last runs to the end).

        ``order`` and ``starts`` are int64; pass p's prediction is ``pred[p]`` when p < len(pred).
        """
        self._check(ids, pred)
        if order.dtype != np.int64 or starts.dtype != np.int64 or order.ndim != 1 or starts.ndim != 1:
            raise ValueError("order and starts must be 1-D int64 arrays")
        order = np.ascontiguousarray(order)
        starts = np.ascontiguousarray(starts)
        cdef int64_t n = order.shape[0], runs = starts.shape[0], r, lo, hi
        cdef const int64_t* o = <const int64_t*>cnp.PyArray_DATA(order)
        cdef const int64_t* s = <const int64_t*>cnp.PyArray_DATA(starts)
        cdef int64_t passes = ids.shape[0]
        for r in range(n):
            if o[r] < 0 or o[r] >= passes:
                raise ValueError(f"order holds pass {o[r]}, outside 0..{passes - 1}")
        for r in range(runs):
            if s[r] < 0 or s[r] > n or (r and s[r] < s[r - 1]):
                raise ValueError("starts must be ascending positions in order")
        self._end_run()
        cdef int code = _code(ids)
        for r in range(runs):
            lo = s[r]
            hi = s[r + 1] if r + 1 < runs else n
            if code == 0:
                self._passes(<const uint8_t*>cnp.PyArray_DATA(ids), o + lo, 0, hi - lo, pred)
            elif code == 1:
                self._passes(<const uint16_t*>cnp.PyArray_DATA(ids), o + lo, 0, hi - lo, pred)
            elif code == 2:
                self._passes(<const uint32_t*>cnp.PyArray_DATA(ids), o + lo, 0, hi - lo, pred)
            else:
                self._passes(<const int64_t*>cnp.PyArray_DATA(ids), o + lo, 0, hi - lo, pred)
            self._end_run()

    cdef int _passes(self, const id_t* ids, const int64_t* index, int64_t first, int64_t count,
                     object pred) except -1:
        cdef const char* gbase = NULL
        cdef int gcode = 0
        cdef int64_t grows = 0, gk = 0
        cdef cnp.ndarray garr
        if pred is not None:
            garr = <cnp.ndarray>pred
            gcode = _code(garr)
            gbase = <const char*>cnp.PyArray_DATA(garr)
            grows = garr.shape[0]
            gk = garr.shape[1]
        cdef int64_t K = self.K, E = self.E, D1 = self.D + 1, mmax = self.mmax, rsize = self.rsize
        cdef int64_t j, i, row, t, e, g, a, b, q, nq, x, slot, lim
        cdef int64_t* last = self.last
        cdef int64_t* pmark = self.pmark
        cdef int64_t* counts = self.counts
        cdef int64_t* gap = self.gap
        cdef int32_t* ring = self.ring
        cdef int32_t* stack = self.stack
        cdef uint8_t* in_stack = self.in_stack
        cdef int64_t* hits = self.hits
        cdef int64_t cap = self.cap
        cdef bint lru = cap > 0
        cdef int32_t carry, cur
        cdef int64_t depth = self.depth, lookups = self.lookups
        cdef const id_t* rowp
        for j in range(count):
            row = index[j] if index != NULL else first + j
            rowp = ids + row * K
            t = self.clock
            slot = (self.p % rsize) if rsize else 0
            b = 0
            a = 0
            for i in range(K):
                e = <int64_t>rowp[i]
                if <uint64_t>e >= <uint64_t>E:
                    self.depth = depth
                    self.lookups = lookups
                    raise ValueError(f"expert id {e} outside 0..{E - 1}")
                counts[e] += 1
                q = last[e]
                if q == t:
                    continue  # a repeat within the pass: sets, not lists
                b += 1
                if q == t - 1 and self.p:
                    a += 1
                g = t - q if q >= self.t0 else self.p + 1
                gap[g if g < mmax else mmax] += 1
                last[e] = t
                if rsize:
                    ring[slot * (D1 - 1) + b - 1] = <int32_t>e
                if lru:
                    lookups += 1
                    x = 0
                    carry = <int32_t>e
                    if in_stack[e]:
                        # Move to front, shifting the more recent ones down; x = e's depth.
                        while True:
                            cur = stack[x]
                            stack[x] = carry
                            if cur == e:
                                break
                            carry = cur
                            x += 1
                        hits[x] += 1
                    else:
                        lim = depth if depth < cap else cap - 1
                        if depth == cap:
                            in_stack[stack[cap - 1]] = 0
                        else:
                            depth += 1
                        while x <= lim:
                            cur = stack[x] if x < lim else 0
                            stack[x] = carry
                            carry = cur
                            x += 1
                        in_stack[e] = 1
            if rsize:
                self.ringn[slot] = b
            if self.p:
                self.reuse[a * D1 + b] += 1
            if row < grows:
                a = 0
                nq = 0
                for i in range(gk):
                    e = _pred_id(gbase, gcode, row * gk + i)
                    if <uint64_t>e >= <uint64_t>E:
                        self.depth = depth
                        self.lookups = lookups
                        raise ValueError(f"predicted expert id {e} outside 0..{E - 1}")
                    if pmark[e] == t:
                        continue
                    pmark[e] = t
                    nq += 1
                    if last[e] == t:
                        a += 1
                self.pilot[a * D1 + b] += 1
                self.aligned += 1
                if nq == b and a == b:
                    self.exact += 1
            self.clock += 1
            self.p += 1
        self.depth = depth
        self.lookups = lookups
        return 0

    cdef void _end_run(self):
        cdef int64_t P = self.p, w, m, g, r, s, corr, top, back, pp, c, slot, i, e
        cdef int64_t D = self.D
        if P:
            # The run's last min(P, mmax - 1) passes: r_e = P - (its last pass) for each expert there.
            top = P if P < self.rsize else self.rsize
            for back in range(1, top + 1):
                pp = P - back
                c = self.t0 + pp
                slot = pp % self.rsize
                for i in range(self.ringn[slot]):
                    e = self.ring[slot * D + i]
                    if self.last[e] == c:
                        self.tail[back] += 1
            top = P if P < self.mmax else self.mmax
            for w in range(self.nwin):
                m = self.windows[w]
                if m > P:
                    continue
                s = 0
                for g in range(1, top + 1):
                    s += self.gap[g] * (g if g < m else m)
                corr = 0
                for r in range(1, m):
                    corr += self.tail[r] * (m - r)
                self.win_total[w] += s - corr
                self.win_count[w] += P - m + 1
            for g in range(top + 2 if top + 2 <= self.mmax + 2 else self.mmax + 2):
                self.gap[g] = 0
                self.tail[g] = 0
        for i in range(self.depth):
            self.in_stack[self.stack[i]] = 0
        self.depth = 0
        self.t0 = self.clock
        self.p = 0

    def sums(self):
        """The totals so far (the current run, if open, is not in the window sums): a dict of ints and lists."""
        cdef int64_t d2 = (self.D + 1) * (self.D + 1)
        return {
            "window_total": [self.win_total[i] for i in range(self.nwin)],
            "window_count": [self.win_count[i] for i in range(self.nwin)],
            "reuse": [self.reuse[i] for i in range(d2)],
            "pilot": [self.pilot[i] for i in range(d2)],
            "exact": self.exact,
            "aligned": self.aligned,
            "hits": [self.hits[i] for i in range(self.cap)],
            "lookups": self.lookups,
            "counts": np.array([self.counts[i] for i in range(self.E)], dtype=np.int64),
        }
