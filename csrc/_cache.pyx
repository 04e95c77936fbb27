# Expert-cache simulation kernels: LRU, LFU and Belady's MIN over a layer's
# trace, with optional one-layer-ahead prefetch. The pure-Python twin,
# turbospark/offload/_cache_py.py, is the reference this must match exactly;
# the definitions are in docs/cache.md and turbospark/offload/cache.py.
#
# LRU is a doubly linked list (O(1) per use); LFU and Belady keep one eviction
# key per resident expert in a binary min-heap indexed by expert (O(log C) per
# update), compared as the pair (a, b); the list is ordered by LRU's key:
#   LRU    (last use, expert)            evict the least recently used
#   LFU    (uses, (last use << s) | e)   evict the least used, then LRU, then lowest id
#   Belady (MAX - next use, expert)      evict the farthest next use (never: first)
# A load evicts the heap's minimum among the experts the pass (or prefetch)
# does not need: needed ones found on top are set aside and put back after
# (rare: they were just used), so a hit costs one key update.

from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport calloc, free, malloc

cimport numpy as cnp
import numpy as np

from turbospark.offload._cache_py import check_arguments

cnp.import_array()

cdef enum:
    LRU = 0
    LFU = 1
    BELADY = 2

cdef int64_t NEVER = 0x7FFFFFFFFFFFFFFF


cdef struct Heap:
    uint64_t* a
    uint64_t* b
    int64_t* expert
    int64_t* pos      # per expert: its heap index, or -1 when not resident
    int64_t size


cdef inline bint _less(Heap* h, int64_t i, int64_t j) noexcept nogil:
    return h.a[i] < h.a[j] or (h.a[i] == h.a[j] and h.b[i] < h.b[j])


cdef inline void _move(Heap* h, int64_t src, int64_t dst) noexcept nogil:
    h.a[dst] = h.a[src]
    h.b[dst] = h.b[src]
    h.expert[dst] = h.expert[src]
    h.pos[h.expert[dst]] = dst


cdef inline void _sift(Heap* h, int64_t i) noexcept nogil:
    """Restore the heap order around slot ``i``, moving a hole rather than swapping."""
    cdef uint64_t a = h.a[i], b = h.b[i]
    cdef int64_t x = h.expert[i]
    cdef int64_t parent, child, right
    while i > 0:
        parent = (i - 1) >> 1
        if not (a < h.a[parent] or (a == h.a[parent] and b < h.b[parent])):
            break
        _move(h, parent, i)
        i = parent
    while True:
        child = 2 * i + 1
        if child >= h.size:
            break
        right = child + 1
        if right < h.size and _less(h, right, child):
            child = right
        if not (h.a[child] < a or (h.a[child] == a and h.b[child] < b)):
            break
        _move(h, child, i)
        i = child
    h.a[i] = a
    h.b[i] = b
    h.expert[i] = x
    h.pos[x] = i


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


cdef inline int64_t _distinct(const int64_t* row, int64_t width, int64_t* mark, int64_t gen, int64_t* buf,
                              const int64_t* nxt, int64_t at, int64_t* nbuf) noexcept nogil:
    """Copy the distinct ids of ``row`` into ``buf`` (and their next uses into ``nbuf``); returns how many."""
    cdef int64_t j, x, m = 0
    for j in range(width):
        x = row[j]
        if mark[x] != gen:
            mark[x] = gen
            buf[m] = x
            if nxt != NULL:
                nbuf[m] = nxt[at + j]
            m += 1
    return m


cdef inline void _key(int policy, int64_t x, uint64_t clock, int shift, const uint64_t* uses, int64_t next_use,
                      uint64_t* a, uint64_t* b) noexcept nogil:
    if policy == LRU:
        a[0] = clock
        b[0] = <uint64_t>x
    elif policy == LFU:
        a[0] = uses[x]
        b[0] = (clock << shift) | <uint64_t>x
    else:
        a[0] = <uint64_t>(NEVER - next_use)
        b[0] = <uint64_t>x


cdef inline int64_t _serve(Heap* h, const int64_t* buf, int64_t m, int64_t slots, int policy, uint64_t clock,
                           int shift, uint64_t* uses, bint demand, const int64_t* nbuf, const int64_t* mark,
                           const int64_t* keep, int64_t* done, int64_t gen, Heap* aside, bint* miss, int64_t* fetched, int64_t t,
                           int64_t* hits, int64_t* useful) noexcept nogil:
    """Make the ``m`` experts of ``buf`` (marked ``gen``) resident with their new keys; returns the loads.

    ``demand``: a pass (hits counted, LFU uses incremented, Belady keyed by
    next use); else a prefetch (loads remembered in ``fetched``; a resident
    expert the pass needs, marked ``gen`` in ``keep``, gets the pass's key at
    once and is marked in ``done``, so the pass skips it). The victim
    of a load is the heap's minimum that is not marked: marked ones met on
    top are set aside in ``aside`` and put back after, so no key has to be
    pinned and a hit costs one key update.
    """
    cdef int64_t i, x, loads = 0
    cdef uint64_t a, b
    aside.size = 0
    for i in range(m):
        x = buf[i]
        miss[i] = h.pos[x] < 0
        if miss[i]:
            continue
        if demand:
            hits[0] += 1
            if fetched[x] == t + 1:
                useful[0] += 1
            if done[x] == gen:
                continue  # keyed for this pass already, at its prefetch
            if policy == LFU:
                uses[x] += 1
            _key(policy, x, clock, shift, uses, nbuf[i], &a, &b)
        elif keep[x] == gen:
            # Needed by the pass too: give it the pass's key now (what the
            # pass would set, and nothing evicts it in between) rather than
            # a prefetch key the pass would overwrite.
            done[x] = gen
            if policy == LFU:
                uses[x] += 1
            _key(policy, x, clock + 1, shift, uses, 0, &a, &b)
        else:
            _key(policy, x, clock, shift, uses, 0, &a, &b)
        _set_key(h, x, a, b)
    for i in range(m):
        if not miss[i]:
            continue
        x = buf[i]
        if h.size + aside.size == slots:  # the set-aside experts still hold their slots
            while mark[h.expert[0]] == gen:
                aside.a[aside.size] = h.a[0]
                aside.b[aside.size] = h.b[0]
                aside.expert[aside.size] = h.expert[0]
                aside.size += 1
                _evict_min(h)
            _evict_min(h)
        if demand and policy == LFU:
            uses[x] += 1
        _key(policy, x, clock, shift, uses, nbuf[i], &a, &b)
        _insert(h, x, a, b)
        loads += 1
        if not demand:
            fetched[x] = t + 1
    for i in range(aside.size):
        _insert(h, aside.expert[i], aside.a[i], aside.b[i])
    return loads


cdef struct Order:
    # LRU as a doubly linked list over experts, least recent first; slot
    # ``sentinel`` (= num_experts) is the list head. Ordered by (last use,
    # expert), the heap's LRU key, so both give the same victims.
    int64_t* prev
    int64_t* next
    int64_t* pos      # per expert: 0 when resident, -1 otherwise (shared with the heap's meaning)
    int64_t sentinel
    int64_t size


cdef inline void _unlink(Order* o, int64_t x) noexcept nogil:
    o.next[o.prev[x]] = o.next[x]
    o.prev[o.next[x]] = o.prev[x]


cdef inline void _append(Order* o, int64_t x) noexcept nogil:
    cdef int64_t tail = o.prev[o.sentinel]
    o.next[tail] = x
    o.prev[x] = tail
    o.next[x] = o.sentinel
    o.prev[o.sentinel] = x


cdef inline int64_t _serve_lru(Order* o, const int64_t* buf, int64_t m, int64_t slots, bint demand,
                               const int64_t* mark, const int64_t* keep, int64_t gen, bint* miss,
                               int64_t* fetched, int64_t t, int64_t* hits, int64_t* useful,
                               int64_t* sorted_ids) noexcept nogil:
    """``_serve`` for LRU on the list: evict from the head skipping marked experts, then move the
    phase's experts to the tail in ascending id (equal last use: the lower id is older)."""
    cdef int64_t i, j, x, v, n = 0, loads = 0
    for i in range(m):
        x = buf[i]
        miss[i] = o.pos[x] < 0
        if not miss[i] and demand:
            hits[0] += 1
            if fetched[x] == t + 1:
                useful[0] += 1
    for i in range(m):
        if not miss[i]:
            continue
        x = buf[i]
        if o.size == slots:
            v = o.next[o.sentinel]
            while mark[v] == gen:
                v = o.next[v]
            _unlink(o, v)
            o.pos[v] = -1
            o.size -= 1
        _append(o, x)
        o.pos[x] = 0
        o.size += 1
        loads += 1
        if not demand:
            fetched[x] = t + 1
    # A prefetch leaves the experts the pass needs where they are: the pass
    # moves them before anything could evict them.
    for i in range(m):
        x = buf[i]
        if not demand and keep[x] == gen:
            continue
        j = n
        while j > 0 and sorted_ids[j - 1] > x:
            sorted_ids[j] = sorted_ids[j - 1]
            j -= 1
        sorted_ids[j] = x
        n += 1
    for i in range(n):
        _unlink(&o[0], sorted_ids[i])
        _append(&o[0], sorted_ids[i])
    return loads


def simulate(
    cnp.ndarray ids not None,
    cnp.ndarray order not None,
    cnp.ndarray starts not None,
    int64_t num_experts,
    object slots,
    int policy,
    object pred=None,
):
    """Serve ``ids[order]`` from a ``slots``-expert cache; see ``turbospark.offload._cache_py.simulate``.

    Takes C-contiguous int64 arrays (ids in 0..num_experts-1, order a list
    of pass indices, starts the ascending run starts into order beginning at
    0, slots >= each pass's and prediction's width), checked by the twin's
    ``check_arguments`` before any is read. Returns (needed, hits, demand
    loads, prefetch loads, useful prefetches).
    """
    check_arguments(ids, order, starts, num_experts, slots, policy, pred)
    if num_experts >= <int64_t>1 << 58:
        # The per-expert buffers' byte sizes would wrap; no capture has this many experts.
        raise MemoryError(f"cache simulation buffers for {num_experts} experts")
    # Slots beyond the experts never fill (both kernels clamp, so any size answers, and the
    # heap is sized by what can be resident).
    cdef int64_t capacity = min(slots, num_experts)
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
    h.a = <uint64_t*>malloc((capacity + 1) * sizeof(uint64_t))
    h.b = <uint64_t*>malloc((capacity + 1) * sizeof(uint64_t))
    h.expert = <int64_t*>malloc((capacity + 1) * sizeof(int64_t))
    h.pos = <int64_t*>malloc((num_experts + 1) * sizeof(int64_t))
    h.size = 0
    cdef int64_t* mark = <int64_t*>calloc(num_experts + 1, sizeof(int64_t))
    cdef int64_t* gmark = <int64_t*>calloc(num_experts + 1, sizeof(int64_t))
    cdef int64_t* gbuf = <int64_t*>malloc((width + 1) * sizeof(int64_t))
    cdef int64_t* done = <int64_t*>calloc(num_experts + 1, sizeof(int64_t))
    cdef Order lru
    lru.prev = <int64_t*>malloc((num_experts + 1) * sizeof(int64_t))
    lru.next = <int64_t*>malloc((num_experts + 1) * sizeof(int64_t))
    lru.pos = h.pos
    lru.sentinel = num_experts
    lru.size = 0
    cdef int64_t* sorted_ids = <int64_t*>malloc((width + 1) * sizeof(int64_t))
    cdef int64_t* fetched = <int64_t*>calloc(num_experts + 1, sizeof(int64_t))
    cdef uint64_t* uses = <uint64_t*>calloc(num_experts + 1, sizeof(uint64_t))
    cdef int64_t* last = <int64_t*>malloc((num_experts + 1) * sizeof(int64_t))
    cdef int64_t* buf = <int64_t*>malloc((width + 1) * sizeof(int64_t))
    cdef int64_t* nbuf = <int64_t*>malloc((width + 1) * sizeof(int64_t))
    cdef Heap aside
    aside.a = <uint64_t*>malloc((width + 1) * sizeof(uint64_t))
    aside.b = <uint64_t*>malloc((width + 1) * sizeof(uint64_t))
    aside.expert = <int64_t*>malloc((width + 1) * sizeof(int64_t))
    aside.pos = NULL
    aside.size = 0
    cdef bint* miss = <bint*>malloc((width + 1) * sizeof(bint))
    cdef int64_t* nxt = NULL
    if policy == BELADY:
        nxt = <int64_t*>malloc((n * k + 1) * sizeof(int64_t))
    cdef bint ok = (h.a != NULL and h.b != NULL and h.expert != NULL and h.pos != NULL and mark != NULL
                    and fetched != NULL and uses != NULL and last != NULL and buf != NULL and nbuf != NULL
                    and aside.a != NULL and aside.b != NULL and aside.expert != NULL and miss != NULL
                    and gmark != NULL and gbuf != NULL and done != NULL and lru.prev != NULL
                    and lru.next != NULL and sorted_ids != NULL
                    and (policy != BELADY or nxt != NULL))
    cdef int64_t needed = 0, hits = 0, loads = 0, prefetched = 0, useful = 0
    cdef int64_t gen = 0, r, t, stop, p, j, i, m, g, x

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
                if policy == LRU:
                    while lru.size > 0:  # empty the list for the new stream
                        x = lru.next[lru.sentinel]
                        _unlink(&lru, x)
                        lru.pos[x] = -1
                        lru.size -= 1
                    lru.next[lru.sentinel] = lru.sentinel
                    lru.prev[lru.sentinel] = lru.sentinel
                for t in range(strt[r], stop):
                    p = ordr[t]
                    gen += 1
                    m = _distinct(trace + p * k, k, mark, gen, buf, nxt, t * k, nbuf)
                    needed += m
                    if policy == LRU:
                        if guess != NULL and p < guessed:
                            g = _distinct(guess + p * gk, gk, gmark, gen, gbuf, NULL, 0, NULL)
                            prefetched += _serve_lru(&lru, gbuf, g, capacity, False, gmark, mark, gen, miss,
                                                     fetched, t, &hits, &useful, sorted_ids)
                        loads += _serve_lru(&lru, buf, m, capacity, True, mark, NULL, gen, miss, fetched, t,
                                            &hits, &useful, sorted_ids)
                        continue
                    if guess != NULL and p < guessed:
                        g = _distinct(guess + p * gk, gk, gmark, gen, gbuf, NULL, 0, NULL)
                        prefetched += _serve(&h, gbuf, g, capacity, policy, <uint64_t>(2 * t), shift, uses,
                                             False, nbuf, gmark, mark, done, gen, &aside, miss, fetched, t,
                                             &hits, &useful)
                    loads += _serve(&h, buf, m, capacity, policy, <uint64_t>(2 * t + 1), shift, uses,
                                    True, nbuf, mark, NULL, done, gen, &aside, miss, fetched, t, &hits, &useful)
    finally:
        free(h.a); free(h.b); free(h.expert); free(h.pos)
        free(mark); free(fetched); free(uses); free(last); free(buf); free(nbuf); free(nxt)
        free(aside.a); free(aside.b); free(aside.expert); free(miss); free(gmark); free(gbuf); free(done)
        free(lru.prev); free(lru.next); free(sorted_ids)
    return needed, hits, loads, prefetched, useful
