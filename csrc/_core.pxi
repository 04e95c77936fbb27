# The RecorderCore class: its state, construction and teardown, the public
# recording methods (which dispatch to _record_one.pxi and _record_block.pxi)
# and the private helpers the facade builds on (_types.RecorderCoreAPI).
#
# Included by _recorder.pyx.

cdef class RecorderCore:
    """Counts, trace and predictions of one capture; see ``RouterHistogram``."""

    cdef Py_ssize_t _num_layers
    cdef uint64_t _num_experts
    cdef Py_ssize_t _top_k
    cdef Py_ssize_t _pred_k
    cdef uint64_t* _counts
    cdef uint64_t* _passes
    cdef IdBuf* _trace
    cdef IdBuf* _pred
    cdef bint _self_test
    cdef Py_ssize_t _logits_layer
    cdef uint64_t _logits_pass
    cdef object _logits
    cdef bint _closed
    cdef bint _ready
    # Commits that changed the counts, and the snapshot last handed out.
    cdef uint64_t _commits
    cdef uint64_t _cached_at
    cdef object _counts_cache
    # record_batch's per-pass tags (_tags.pxi): NULL until a tagged pass commits.
    cdef TagBuf* _tags
    cdef bint _tagged
    # trace_cap: each layer keeps its first _cap passes (trace, predictions, tags);
    # UINT64_MAX when unbounded, so the commit's test needs no branch on _capped.
    cdef uint64_t _cap
    cdef bint _capped
    # trace="stream": per layer the passes already taken out by _take_chunk (the
    # buffers hold only the rest), ids committed since, and the count that asks
    # the facade to take them (UINT64_MAX: never, one compare per call).
    cdef uint64_t* _taken
    cdef uint64_t* _pred_taken
    cdef uint64_t _unspilled
    cdef uint64_t _spill_at
    # Takes made so far (_take_chunk's serial: a later take's summary is told apart).
    cdef uint64_t _takes

    def __cinit__(self, *args, **kwargs):
        self._counts = NULL
        self._passes = NULL
        self._trace = NULL
        self._pred = NULL
        self._tags = NULL
        self._taken = NULL
        self._pred_taken = NULL
        self._spill_at = <uint64_t>0xFFFFFFFFFFFFFFFF
        self._logits = None
        self._logits_layer = -1

    def __init__(self, num_layers, num_experts, top_k, trace, pilot, logits_layer, logits_pass, trace_cap=None):
        if self._ready:
            raise RuntimeError("a recorder core is initialised once")
        # Checked here, not trusted from the facade: these sizes index C arrays.
        num_layers, num_experts, top_k, logits_layer, logits_pass = _convert.core_arguments(
            num_layers, num_experts, top_k, pilot, logits_layer, logits_pass)
        cap = _convert.trace_cap(trace_cap, trace)
        self._capped = cap is not None
        self._cap = <uint64_t>cap if self._capped else <uint64_t>0xFFFFFFFFFFFFFFFF
        self._num_layers = num_layers
        self._num_experts = num_experts
        self._top_k = top_k
        self._pred_k = 0
        self._counts = <uint64_t*>calloc(max(self._num_layers * self._num_experts, 1), sizeof(uint64_t))
        self._passes = <uint64_t*>calloc(max(self._num_layers, 1), sizeof(uint64_t))
        self._taken = <uint64_t*>calloc(max(self._num_layers, 1), sizeof(uint64_t))
        self._pred_taken = <uint64_t*>calloc(max(self._num_layers, 1), sizeof(uint64_t))
        if self._counts == NULL or self._passes == NULL or self._taken == NULL or self._pred_taken == NULL:
            raise MemoryError()
        if bool(trace):
            self._trace = self._new_rows()
        if pilot is not None:
            self._pred = self._new_rows()
        self._self_test = pilot == "self"
        self._logits_layer = logits_layer
        self._logits_pass = logits_pass
        self._ready = True

    cdef IdBuf* _new_rows(self) except NULL:
        cdef IdBuf* rows = <IdBuf*>calloc(max(self._num_layers, 1), sizeof(IdBuf))
        cdef Py_ssize_t layer
        if rows == NULL:
            raise MemoryError()
        for layer in range(self._num_layers):
            rows[layer].data = <uint32_t*>malloc(FIRST_CAPACITY * sizeof(uint32_t))
            if rows[layer].data == NULL:
                _free_rows(rows, layer)
                raise MemoryError()
            rows[layer].cap = FIRST_CAPACITY
        return rows

    def __dealloc__(self):
        free(self._counts)
        free(self._passes)
        free(self._taken)
        free(self._pred_taken)
        _free_rows(self._trace, self._num_layers)
        _free_rows(self._pred, self._num_layers)
        _free_tags(self._tags, self._num_layers)

    @property
    def num_layers(self):
        return self._num_layers

    @property
    def num_experts(self):
        return self._num_experts

    @property
    def top_k(self):
        return self._top_k

    @property
    def closed(self):
        return self._closed

    @property
    def trace_enabled(self):
        return self._trace != NULL

    @property
    def trace_cap(self):
        return self._cap if self._capped else None

    def pilot_offset(self):
        return 0 if self._self_test else 1

    def pilot_enabled(self):
        return self._pred != NULL

    def record(self, layer, selected):
        _record_pass(self, layer, selected, False)
        if self._unspilled >= self._spill_at:
            self._spill()

    def record_prediction(self, layer, predicted):
        _record_pass(self, layer, predicted, True)
        if self._unspilled >= self._spill_at:
            self._spill()

    def record_many(self, layer, selected, mask=None):
        _record_block(self, layer, selected, mask, False, NULL)
        if self._unspilled >= self._spill_at:
            self._spill()

    def record_batch(self, layer, ids_2d, *, seq, phase, mask=None):
        """Record a block of passes that belong to different sequences, in one phase.

        Takes ``ids_2d`` (n, top_k) integer ids (ndarray, nested list or CPU
        tensor), ``seq`` one non-negative sequence id per row (list, ndarray or
        CPU tensor), ``phase`` ``"prompt"`` or ``"decode"`` for every row, and
        an optional boolean ``mask`` of length n: only the rows it keeps are
        validated and recorded (the others may hold anything, e.g. -1 padding,
        except that a dropped row's ``seq`` entry must still be an integer,
        of any value: a str, float, bool or None there raises TypeError).
        Counts and trace are exactly those of ``record_many`` with the kept
        rows; the capture then also carries each pass's sequence id and phase,
        committed with the passes in one step (no write, signal handler or
        other thread sees a pass without its tag). Raises what ``record_many``
        raises, and TypeError/ValueError for a bad ``seq``, ``phase`` or
        ``mask``; a rejected call records nothing.
        """
        _record_tagged(self, layer, ids_2d, seq, phase, mask)
        if self._unspilled >= self._spill_at:
            self._spill()

    def record_prediction_many(self, layer, predicted, mask=None):
        _record_block(self, layer, predicted, mask, True, NULL)
        if self._unspilled >= self._spill_at:
            self._spill()

    def record_router_logits(self, layer, logits):
        cdef Py_ssize_t index, got
        if self._logits_layer < 0:
            return  # no row requested: free, as the reference's call is
        if self._closed:
            raise _errors.closed()
        index = _layer_index(self, layer)
        got = _convert.logits_length(logits)
        if <uint64_t>got != self._num_experts:
            raise _errors.logits_length(got, self._num_experts)
        if index != self._logits_layer or self._passes[index] != self._logits_pass or self._logits is not None:
            return
        row = _convert.logit_row(logits, self._num_experts)
        # Converting ran Python code: another thread may have closed the
        # recorder, or recorded a pass or this very row, meanwhile.
        if self._closed:
            raise _errors.closed()
        if self._passes[index] == self._logits_pass and self._logits is None:
            self._logits = row

    def _after_fork_in_child(self):
        """Nothing to reset: this core holds no lock (the GIL makes each call atomic)."""

    def _mark_closed(self):
        """Close for recording; True only for the call that did it."""
        cdef bint was_open = not self._closed
        self._closed = True
        return was_open

    def _counts_snapshot(self):
        """The counts as a read-only int64 array, copied only when a pass was recorded since the last one."""
        cdef cnp.ndarray out
        if self._counts_cache is not None and self._cached_at == self._commits:
            return self._counts_cache
        # int64 like a loaded Capture's counts; no count can reach 2**63.
        out = np.empty((self._num_layers, self._num_experts), dtype=np.int64)
        memcpy(cnp.PyArray_DATA(out), self._counts, self._num_layers * self._num_experts * sizeof(uint64_t))
        out.setflags(write=False)
        self._counts_cache = out
        self._cached_at = self._commits
        return out

    def _passes_array(self):
        cdef cnp.ndarray out = np.empty(self._num_layers, dtype=np.int64)
        memcpy(cnp.PyArray_DATA(out), self._passes, self._num_layers * sizeof(uint64_t))
        return out

    def _trace_array(self, layer):
        cdef Py_ssize_t index = _layer_index(self, layer)
        if self._trace == NULL:
            return None
        return _rows_array(&self._trace[index], self._top_k)

    def _predictions_array(self, layer):
        cdef Py_ssize_t index = _layer_index(self, layer)
        if self._pred == NULL:
            return None
        return _rows_array(&self._pred[index], self._top_k or self._pred_k)

    def _logits_capture(self):
        if self._logits_layer < 0:
            return None
        return (self._logits_layer, self._logits_pass, self._logits)

    def _json_document(self, bytes tail):
        """The JSON document up to ``router_logits``, followed by ``tail``."""
        return _json_document(self, tail)

    def _stream_every(self, ids):
        """Call ``self._spill()`` after any record call that leaves ``ids`` or more ids untaken (trace="stream")."""
        if self._trace == NULL or self._capped:
            raise ValueError("a streamed trace needs the trace on and no trace_cap")
        self._spill_at = <uint64_t>max(int(ids), 1)

    def _take_chunk(self, list into=None):
        """Take every committed row out of the buffers, with the summary they complete; see the pure core.

        ``into`` gets ``(width, rows)`` appended in the same step that empties
        the buffers: no Python code runs between the reset and the append.
        """
        cdef Py_ssize_t layer, n = self._num_layers
        cdef size_t i, passes, tagged
        cdef TagBuf* t
        cdef char* seq
        cdef char* phase
        # Every object the reads need exists first: the reads and the reset below then
        # run no Python code and allocate nothing the garbage collector tracks, so no
        # other call (a finalizer, a signal handler) can record in between.
        cdef list parts = [None] * (6 * n)
        logits = self._logits_capture()
        width = self._top_k or self._pred_k
        head = _json_document(self, b"", True)
        for layer in range(n):
            passes = <size_t>(self._passes[layer] - self._taken[layer])
            parts[6 * layer] = self._taken[layer]
            parts[6 * layer + 5] = self._pred_taken[layer]
            if self._trace != NULL:
                parts[6 * layer + 1] = PyBytes_FromStringAndSize(<char*>self._trace[layer].data,
                                                                 self._trace[layer].len * sizeof(uint32_t))
            if self._pred != NULL:
                parts[6 * layer + 2] = PyBytes_FromStringAndSize(<char*>self._pred[layer].data,
                                                                 self._pred[layer].len * sizeof(uint32_t))
            if self._tagged:
                t = &self._tags[layer]
                tagged = t.len if t.len < passes else passes
                seq_bytes = PyBytes_FromStringAndSize(NULL, passes * sizeof(int64_t))
                phase_bytes = PyBytes_FromStringAndSize(NULL, passes)
                seq = <char*>seq_bytes
                phase = <char*>phase_bytes
                if tagged:
                    memcpy(seq, t.seq, tagged * sizeof(int64_t))
                    memcpy(phase, t.phase, tagged)
                for i in range(tagged, passes):
                    (<int64_t*>seq)[i] = DEFAULT_SEQ
                    phase[i] = DEFAULT_PHASE
                parts[6 * layer + 3] = seq_bytes
                parts[6 * layer + 4] = phase_bytes
        rows = [tuple(parts[6 * layer:6 * layer + 6]) for layer in range(n)]
        chunk = (width, rows)
        taken = (head, width, rows, logits, self._takes + 1)
        for layer in range(n):
            if self._trace != NULL:
                self._trace[layer].len = 0
            if self._pred != NULL:
                if width:
                    self._pred_taken[layer] += self._pred[layer].len // <size_t>width
                self._pred[layer].len = 0
            if self._tags != NULL:
                self._tags[layer].len = 0
            self._taken[layer] = self._passes[layer]
        self._unspilled = 0
        self._takes += 1
        if into is not None:
            into.append(chunk)  # PyList_Append: runs no Python code
        return taken

    def _add_counts(self, counts, passes, Py_ssize_t top_k):
        """Add whole passes known by their counts only: ``counts`` (L, E) and ``passes`` (L,) int64.

        For the device path's counts-only mode; refused (ValueError) while the
        trace or the probe is on, or when a row does not sum to passes x top_k.
        Learns ``top_k`` when it was still 0 and passes were added.
        """
        cdef const int64_t[:, ::1] added
        cdef const int64_t[::1] more
        cdef Py_ssize_t layer
        cdef uint64_t e
        cdef uint64_t* row
        cdef bint any_pass = False
        if self._closed:
            raise _errors.closed()
        added_arr, more_arr = _counts.added_counts(
            counts, passes, top_k, self._num_layers, self._num_experts,
            self._top_k or self._pred_k, self._trace != NULL or self._pred != NULL)
        added = added_arr.reshape(self._num_layers, self._num_experts)
        more = more_arr
        # Validation ran Python code: another thread may have closed us meanwhile.
        if self._closed:
            raise _errors.closed()
        for layer in range(self._num_layers):
            row = self._counts + layer * self._num_experts
            for e in range(self._num_experts):
                row[e] += <uint64_t>added[layer, e]
            self._passes[layer] += <uint64_t>more[layer]
            any_pass = any_pass or more[layer] > 0
        if self._top_k == 0 and any_pass:
            self._top_k = top_k
        # A commit like any other: the counts snapshot keyed on it is stale now.
        self._commits += 1
