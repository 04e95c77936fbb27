# Expert-cache simulation kernels: LRU, LFU and Belady's MIN over a layer's
# trace, with optional one-layer-ahead prefetch. The pure-Python twin,
# turbospark/analysis/_cache_py.py, is the reference this must match exactly;
# the definitions are in docs/cache.md and turbospark/analysis/cache.py.
#
# Every policy is one eviction key per resident expert in a binary min-heap
# indexed by expert (O(log C) per update), compared as the pair (a, b):
#   LRU    (last use, expert)            evict the least recently used
#   LFU    (uses, (last use << s) | e)   evict the least used, then LRU, then lowest id
#   Belady (MAX - next use, expert)      evict the farthest next use (never: first)
# While a pass is served its experts hold the largest keys, so a miss never
# evicts an expert the same pass needs: LRU's new key and Belady's "next use
# = now" are the largest already; LFU pins them with PINNED until the pass is done.

from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport calloc, free, malloc

cimport numpy as cnp
import numpy as np

cnp.import_array()

cdef enum:
    LRU = 0
    LFU = 1
    BELADY = 2

cdef uint64_t PINNED = 0xFFFFFFFFFFFFFFFF
cdef int64_t NEVER = 0x7FFFFFFFFFFFFFFF


cdef struct Heap:
    uint64_t* a
    uint64_t* b
    int64_t* expert
    int64_t* pos      # per expert: its heap index, or -1 when not resident
    int64_t size


cdef inline bint _less(Heap* h, int64_t i, int64_t j) noexcept nogil:
    return h.a[i] < h.a[j] or (h.a[i] == h.a[j] and h.b[i] < h.b[j])


cdef inline void _swap(Heap* h, int64_t i, int64_t j) noexcept nogil:
    cdef uint64_t ta = h.a[i], tb = h.b[i]
    cdef int64_t te = h.expert[i]
    h.a[i] = h.a[j]; h.b[i] = h.b[j]; h.expert[i] = h.expert[j]
    h.a[j] = ta; h.b[j] = tb; h.expert[j] = te
    h.pos[h.expert[i]] = i
    h.pos[h.expert[j]] = j


cdef inline void _sift(Heap* h, int64_t i) noexcept nogil:
    cdef int64_t parent, child, right
    while i > 0:
        parent = (i - 1) >> 1
        if not _less(h, i, parent):
            break
        _swap(h, i, parent)
        i = parent
    while True:
        child = 2 * i + 1
        if child >= h.size:
            break
        right = child + 1
        if right < h.size and _less(h, right, child):
            child = right
        if not _less(h, child, i):
            break
        _swap(h, i, child)
        i = child


cdef inline void _set_key(Heap* h, int64_t x, uint64_t a, uint64_t b) noexcept nogil:
    cdef int64_t i = h.pos[x]
    h.a[i] = a
    h.b[i] = b
    _sift(h, i)


cdef inline void _insert(Heap* h, int64_t x, uint64_t a, uint64_t b) noexcept nogil:
    cdef int64_t i = h.size
    h.size += 1
    h.a[i] = a
    h.b[i] = b
    h.expert[i] = x
    h.pos[x] = i
    _sift(h, i)


cdef inline void _evict_min(Heap* h) noexcept nogil:
    cdef int64_t last = h.size - 1
    h.pos[h.expert[0]] = -1
    h.size = last
    if last > 0:
        h.a[0] = h.a[last]
        h.b[0] = h.b[last]
        h.expert[0] = h.expert[last]
        h.pos[h.expert[0]] = 0
        _sift(h, 0)


cdef inline void _clear(Heap* h) noexcept nogil:
    cdef int64_t i
    for i in range(h.size):
        h.pos[h.expert[i]] = -1
    h.size = 0


def simulate(
    cnp.ndarray ids not None,
    cnp.ndarray order not None,
    cnp.ndarray starts not None,
    int64_t num_experts,
    int64_t slots,
    int policy,
    object pred=None,
):
    """Serve ``ids[order]`` from a ``slots``-expert cache; see ``turbospark.analysis._cache_py.simulate``.

    Takes C-contiguous int64 arrays validated by the caller (ids in
    0..num_experts-1, order a list of pass indices, starts the ascending run
    starts into order beginning at 0, slots >= each pass's and prediction's
    width). Returns (needed, hits, demand loads, prefetch loads, useful prefetches).
    """
    cdef int64_t passes = ids.shape[0]
    cdef int64_t k = ids.shape[1]
    cdef int64_t n = order.shape[0]
    cdef int64_t runs = starts.shape[0]
    cdef const int64_t* trace = <const int64_t*>cnp.PyArray_DATA(ids)
    cdef const int64_t* ordr = <const int64_t*>cnp.PyArray_DATA(order)
    cdef const int64_t* strt = <const int64_t*>cnp.PyArray_DATA(starts)
    cdef const int64_t* guess = NULL
    cdef int64_t guessed = 0, gk = 0
    cdef cnp.ndarray pred_arr
    if pred is not None:
        pred_arr = <cnp.ndarray>pred
        guess = <const int64_t*>cnp.PyArray_DATA(pred_arr)
        guessed = pred_arr.shape[0]
        gk = pred_arr.shape[1]
    cdef int shift = 1
    while (<int64_t>1 << shift) < num_experts + 1:
        shift += 1

    cdef Heap h
    cdef int64_t width = k if k > gk else gk
    h.a = <uint64_t*>malloc((slots + 1) * sizeof(uint64_t))
    h.b = <uint64_t*>malloc((slots + 1) * sizeof(uint64_t))
    h.expert = <int64_t*>malloc((slots + 1) * sizeof(int64_t))
    h.pos = <int64_t*>malloc((num_experts + 1) * sizeof(int64_t))
    h.size = 0
    cdef int64_t* mark = <int64_t*>calloc(num_experts + 1, sizeof(int64_t))
    cdef int64_t* fetched = <int64_t*>calloc(num_experts + 1, sizeof(int64_t))
    cdef uint64_t* uses = <uint64_t*>calloc(num_experts + 1, sizeof(uint64_t))
    cdef int64_t* last = <int64_t*>malloc((num_experts + 1) * sizeof(int64_t))
    cdef int64_t* buf = <int64_t*>malloc((width + 1) * sizeof(int64_t))
    cdef int64_t* nbuf = <int64_t*>malloc((width + 1) * sizeof(int64_t))
    cdef int64_t* nxt = NULL
    if policy == BELADY:
        nxt = <int64_t*>malloc((n * k + 1) * sizeof(int64_t))
    cdef bint ok = (h.a != NULL and h.b != NULL and h.expert != NULL and h.pos != NULL and mark != NULL
                    and fetched != NULL and uses != NULL and last != NULL and buf != NULL and nbuf != NULL
                    and (policy != BELADY or nxt != NULL))
    cdef int64_t needed = 0, hits = 0, loads = 0, prefetched = 0, useful = 0
    cdef int64_t gen = 0, r, t, stop, p, j, i, m, x
    cdef uint64_t clock
    try:
        if not ok:
            raise MemoryError("cache simulation buffers")
        with nogil:
            for x in range(num_experts):
                h.pos[x] = -1
            for r in range(runs):
                stop = strt[r + 1] if r + 1 < runs else n
                _clear(&h)
                if policy == LFU:
                    for x in range(num_experts):
                        uses[x] = 0
                if policy == BELADY:
                    # Next use of each of a pass's entries: the run position of
                    # the next pass that needs the same expert, or NEVER.
                    for x in range(num_experts):
                        last[x] = NEVER
                    t = stop - 1
                    while t >= strt[r]:
                        p = ordr[t]
                        for j in range(k):
                            nxt[t * k + j] = last[trace[p * k + j]]
                        for j in range(k):
                            last[trace[p * k + j]] = t
                        t -= 1
                for t in range(strt[r], stop):
                    p = ordr[t]
                    if guess != NULL and p < guessed:
                        gen += 1
                        m = 0
                        for j in range(gk):
                            x = guess[p * gk + j]
                            if mark[x] != gen:
                                mark[x] = gen
                                buf[m] = x
                                m += 1
                        clock = <uint64_t>(2 * t)
                        if policy == LFU:
                            for i in range(m):
                                if h.pos[buf[i]] >= 0:
                                    _set_key(&h, buf[i], PINNED, PINNED)
                        else:
                            # LRU: the new key is already the largest, so it pins.
                            for i in range(m):
                                if h.pos[buf[i]] >= 0:
                                    _set_key(&h, buf[i], clock, <uint64_t>buf[i])
                        for i in range(m):
                            x = buf[i]
                            if h.pos[x] < 0:
                                if h.size == slots:
                                    _evict_min(&h)
                                if policy == LFU:
                                    _insert(&h, x, PINNED, PINNED)
                                else:
                                    _insert(&h, x, clock, <uint64_t>x)
                                prefetched += 1
                                fetched[x] = t + 1
                        if policy == LFU:
                            for i in range(m):
                                x = buf[i]
                                _set_key(&h, x, uses[x], (clock << shift) | <uint64_t>x)
                    gen += 1
                    m = 0
                    for j in range(k):
                        x = trace[p * k + j]
                        if mark[x] != gen:
                            mark[x] = gen
                            buf[m] = x
                            if policy == BELADY:
                                nbuf[m] = nxt[t * k + j]
                            m += 1
                    needed += m
                    clock = <uint64_t>(2 * t + 1)
                    # Pin the pass's resident experts. LRU's new key is the
                    # largest, so it pins; Belady's current key (next use =
                    # now) is the largest already.
                    for i in range(m):
                        x = buf[i]
                        if h.pos[x] >= 0:
                            hits += 1
                            if fetched[x] == t + 1:
                                useful += 1
                            if policy == LRU:
                                _set_key(&h, x, clock, <uint64_t>x)
                            elif policy == LFU:
                                _set_key(&h, x, PINNED, PINNED)
                    for i in range(m):
                        x = buf[i]
                        if h.pos[x] < 0:
                            if h.size == slots:
                                _evict_min(&h)
                            if policy == LRU:
                                _insert(&h, x, clock, <uint64_t>x)
                            elif policy == LFU:
                                _insert(&h, x, PINNED, PINNED)
                            else:
                                _insert(&h, x, <uint64_t>(NEVER - t), <uint64_t>x)
                            loads += 1
                    if policy == LFU:
                        for i in range(m):
                            x = buf[i]
                            uses[x] += 1
                            _set_key(&h, x, uses[x], (clock << shift) | <uint64_t>x)
                    elif policy == BELADY:
                        for i in range(m):
                            _set_key(&h, buf[i], <uint64_t>(NEVER - nbuf[i]), <uint64_t>buf[i])
    finally:
        free(h.a); free(h.b); free(h.expert); free(h.pos)
        free(mark); free(fetched); free(uses); free(last); free(buf); free(nbuf); free(nxt)
    return needed, hits, loads, prefetched, useful
