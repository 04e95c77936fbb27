# The JSON writer: the core's part of the capture document (sizes, counts,
# trace, pred) written into one buffer sized up front, then the facade's
# tail. The only path: RouterHistogram._document calls RecorderCore._json_document.
#
# Included by _recorder.pyx.

cdef inline char* _put_u64(char* p, uint64_t value) noexcept nogil:
    cdef char digits[20]
    cdef int n = 0
    if value < 10:
        p[0] = <char>(48 + value)
        return p + 1
    while value:
        digits[n] = <char>(48 + value % 10)
        value //= 10
        n += 1
    while n:
        n -= 1
        p[0] = digits[n]
        p += 1
    return p


cdef char* _put_rows(char* p, IdBuf* rows, Py_ssize_t num_layers) noexcept nogil:
    cdef Py_ssize_t layer
    cdef size_t i
    for layer in range(num_layers):
        if layer:
            p[0] = 44  # ','
            p += 1
        p[0] = 91  # '['
        p += 1
        for i in range(rows[layer].len):
            if i:
                p[0] = 44
                p += 1
            p = _put_u64(p, rows[layer].data[i])
        p[0] = 93  # ']'
        p += 1
    return p


cdef char* _put_text(char* p, const char* text, Py_ssize_t n) noexcept nogil:
    memcpy(p, text, n)
    return p + n


cdef char* _put_tags(RecorderCore self, char* p) noexcept:
    """``,"seq":[...],"phase":[...]``: one entry per pass of each layer, untagged passes as the defaults."""
    cdef Py_ssize_t layer
    cdef size_t i, passes, tagged
    cdef TagBuf* t
    cdef int column
    for column in range(2):
        p = _put_text(p, b',"seq":[' if column == 0 else b',"phase":[', 8 if column == 0 else 10)
        for layer in range(self._num_layers):
            if layer:
                p[0] = 44
                p += 1
            p[0] = 91
            p += 1
            t = &self._tags[layer]
            passes = _kept(self._passes[layer], self._cap) - self._taken[layer]
            tagged = t.len if t.len < passes else passes
            for i in range(passes):
                if i:
                    p[0] = 44
                    p += 1
                if column == 0:
                    p = _put_u64(p, <uint64_t>(t.seq[i] if i < tagged else DEFAULT_SEQ))
                else:
                    p[0] = <char>(48 + (t.phase[i] if i < tagged else DEFAULT_PHASE))
                    p += 1
            p[0] = 93
            p += 1
        p[0] = 93
        p += 1
    return p


cdef bytes _json_document(RecorderCore self, bytes tail, bint summary=False):
    """The JSON document up to ``router_logits``, then ``tail`` (the facade's part), then the
    ``seq``/``phase`` columns when a tagged pass was recorded; the facade adds the closing brace.

    ``summary``: only the sizes and ``counts`` before ``tail`` (a streamed capture's JSON, whose trace,
    predictions and tags live in its sidecar)."""
    cdef size_t bound = 220 + len(tail)  # 60 of it for trace_cap and trace_dropped's key
    # Room for any id a uint32 buffer can hold (10 digits and a comma),
    # not just those below num_experts: the writer never trusts that
    # every committed id was checked.
    cdef size_t id_width = 11
    cdef Py_ssize_t layer
    cdef uint64_t e
    cdef char* buf
    cdef char* p
    cdef uint64_t* row
    for layer in range(self._num_layers):
        bound += 3 + 21 * self._num_experts + 21  # the counts, and a trace_dropped entry
        if summary:
            continue  # nothing per pass: the summary's size must not grow with the run (issue 25)
        if self._trace != NULL:
            bound += 3 + id_width * self._trace[layer].len
        if self._pred != NULL:
            bound += 3 + id_width * self._pred[layer].len
        if self._tagged:
            # A sequence id (up to 19 digits and a comma) and a phase digit and comma per pass
            # _put_tags writes: the kept, untaken ones, not every pass ever counted (a trace_cap).
            bound += 6 + 22 * (_kept(self._passes[layer], self._cap) - self._taken[layer])
    head = ('{"num_layers":%d,"num_experts":%d,"top_k":%d,"counts":['
            % (self._num_layers, self._num_experts if self._num_layers else 0, self._top_k)).encode()
    bound += len(head)
    buf = <char*>malloc(bound)
    if buf == NULL:
        raise MemoryError()
    try:
        p = _put_text(buf, head, len(head))
        for layer in range(self._num_layers):
            if layer:
                p[0] = 44
                p += 1
            p[0] = 91
            p += 1
            row = self._counts + layer * self._num_experts
            for e in range(self._num_experts):
                if e:
                    p[0] = 44
                    p += 1
                p = _put_u64(p, row[e])
            p[0] = 93
            p += 1
        p[0] = 93
        p += 1
        if self._trace != NULL and not summary:
            p = _put_text(p, b',"trace":[', 10)
            p = _put_rows(p, self._trace, self._num_layers)
            p[0] = 93
            p += 1
            if self._capped:
                p = _put_text(p, b',"trace_cap":', 13)
                p = _put_u64(p, self._cap)
                p = _put_text(p, b',"trace_dropped":[', 18)
                for layer in range(self._num_layers):
                    if layer:
                        p[0] = 44
                        p += 1
                    p = _put_u64(p, self._passes[layer] - _kept(self._passes[layer], self._cap))
                p[0] = 93
                p += 1
        if self._pred != NULL and not summary:
            p = _put_text(p, b',"pred":[', 9)
            p = _put_rows(p, self._pred, self._num_layers)
            p[0] = 93
            p += 1
        p = _put_text(p, tail, len(tail))
        if self._tagged and not summary:
            p = _put_tags(self, p)
        return PyBytes_FromStringAndSize(buf, p - buf)
    finally:
        free(buf)
