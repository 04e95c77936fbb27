"""``trace_cap``: a bounded in-memory trace, exact counts, and the dropped passes said in the file.

Each layer keeps its first N passes in the trace, the predictions and
record_batch's tags (so every kept row stays aligned); counts and passes keep
counting every pass; the JSON carries ``"trace_cap"`` and ``"trace_dropped"``
(written only when a cap is set). Every test runs on both cores (``cls``).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import turbospark
from childproc import run_script
from turbospark import RouterHistogram

HIST = "TURBOSPARK_ROUTER_HIST"
TRACE = "TURBOSPARK_ROUTER_TRACE"
CAP = "TURBOSPARK_ROUTER_TRACE_CAP"


def test_exact_small_case_by_hand(make: Callable[..., Any], cls: Any) -> None:
    hist = make(2, 4, 2, cls=cls, trace=True, trace_cap=2)
    hist.record(0, [0, 1])
    hist.record(0, [1, 2])
    hist.record(0, [2, 3])  # beyond the cap: counted, not traced
    hist.record_many(1, [[3, 0], [0, 1], [1, 2]])  # the cap falls inside the block
    assert hist.to_json() == (
        '{"num_layers":2,"num_experts":4,"top_k":2,"counts":[[1,2,2,1],[2,2,1,1]],'
        '"trace":[[0,1,1,2],[3,0,0,1]],"trace_cap":2,"trace_dropped":[1,1]}'
    )
    assert hist.passes.tolist() == [3, 3]
    assert hist.trace_dropped.tolist() == [1, 1]
    assert hist.trace_cap == 2
    assert hist.trace(0).tolist() == [[0, 1], [1, 2]]


def test_no_cap_leaves_the_document_unchanged(make: Callable[..., Any], cls: Any) -> None:
    hist = make(1, 3, 1, cls=cls, trace=True)
    hist.record(0, [2])
    assert hist.to_json() == '{"num_layers":1,"num_experts":3,"top_k":1,"counts":[[0,0,1]],"trace":[[2]]}'
    assert hist.trace_cap is None and hist.trace_dropped is None


def test_a_cap_not_reached_still_says_so(make: Callable[..., Any], cls: Any) -> None:
    hist = make(2, 3, 1, cls=cls, trace=True, trace_cap=5)
    hist.record(1, [2])
    assert hist.to_json() == (
        '{"num_layers":2,"num_experts":3,"top_k":1,"counts":[[0,0,0],[0,0,1]],'
        '"trace":[[],[2]],"trace_cap":5,"trace_dropped":[0,0]}'
    )


def test_predictions_keep_the_first_n_rows(make: Callable[..., Any], cls: Any) -> None:
    hist = make(2, 4, 1, cls=cls, trace=True, pilot="next", trace_cap=2)
    for expert in (0, 1, 2):
        hist.record_prediction(1, [expert])
        hist.record(1, [expert])
    hist.record_prediction_many(0, [[3], [2], [1]])
    assert hist.to_json() == (
        '{"num_layers":2,"num_experts":4,"top_k":1,"counts":[[0,0,0,0],[1,1,1,0]],'
        '"trace":[[],[0,1]],"trace_cap":2,"trace_dropped":[0,1],"pred":[[3,2],[0,1]]}'
    )
    assert hist.predictions(0).tolist() == [[3], [2]]


def test_record_batch_tags_stay_aligned_with_the_kept_passes(make: Callable[..., Any], cls: Any) -> None:
    hist = make(1, 4, 1, cls=cls, trace=True, trace_cap=3)
    hist.record(0, [0])  # untagged: reads as sequence 0, decode
    hist.record_batch(0, [[1], [2], [3]], seq=[7, 8, 9], phase="prompt")  # the third row is dropped
    hist.record_batch(0, [[0]], seq=[4], phase="decode")  # all dropped
    assert hist.to_json() == (
        '{"num_layers":1,"num_experts":4,"top_k":1,"counts":[[2,1,1,1]],'
        '"trace":[[0,1,2]],"trace_cap":3,"trace_dropped":[2],"seq":[[0,7,8]],"phase":[[1,0,0]]}'
    )


def test_masked_batch_counts_only_kept_rows_toward_the_cap(make: Callable[..., Any], cls: Any) -> None:
    hist = make(1, 4, 1, cls=cls, trace=True, trace_cap=2)
    hist.record_batch(0, np.array([[1], [-1], [2], [3]]), seq=[5, 0, 6, 7], phase="decode",
                      mask=[True, False, True, True])
    assert hist.to_json() == (
        '{"num_layers":1,"num_experts":4,"top_k":1,"counts":[[0,1,1,1]],'
        '"trace":[[1,2]],"trace_cap":2,"trace_dropped":[1],"seq":[[5,6]],"phase":[[1,1]]}'
    )


def test_untagged_passes_beyond_the_cap_are_not_padded(make: Callable[..., Any], cls: Any) -> None:
    hist = make(1, 3, 1, cls=cls, trace=True, trace_cap=2)
    for expert in (0, 1, 2, 0):
        hist.record(0, [expert])
    hist.record_batch(0, [[1]], seq=[3], phase="prompt")
    assert hist.to_json() == (
        '{"num_layers":1,"num_experts":3,"top_k":1,"counts":[[2,2,1]],'
        '"trace":[[0,1]],"trace_cap":2,"trace_dropped":[3],"seq":[[0,0]],"phase":[[1,1]]}'
    )


def test_the_written_capture_loads_and_analyses(make: Callable[..., Any], cls: Any, tmp_path: Any) -> None:
    hist = make(1, 4, 2, cls=cls, trace=True, trace_cap=1)
    hist.record(0, [0, 1])
    hist.record(0, [2, 3])
    hist.close()
    capture = turbospark.load(hist.path)
    assert capture.trace_cap == 1 and capture.trace_dropped.tolist() == [1]
    result = turbospark.analyze(capture)
    assert result["checks"] == {"counts_sum_ok": True, "trace_matches_counts": True}
    assert result["trace_cap"] == 1 and result["trace_dropped"] == [1]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"trace": True, "trace_cap": 0}, ValueError, "trace_cap must be at least 1, got 0"),
        ({"trace": True, "trace_cap": -3}, ValueError, "trace_cap must be at least 1, got -3"),
        ({"trace": True, "trace_cap": 1.5}, TypeError, "trace_cap must be an integer, got float 1.5"),
        ({"trace": True, "trace_cap": True}, TypeError, "trace_cap must be an integer, got bool True"),
        ({"trace_cap": 4}, ValueError, r"trace_cap=4 needs the trace on \(trace=True\)"),
    ],
)
def test_constructor_rejects_a_bad_cap(make: Callable[..., Any], cls: Any, kwargs: dict[str, Any],
                                       error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        make(1, 2, 1, cls=cls, **kwargs)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Callable[..., Any]:
    for name in (HIST, TRACE, CAP):
        monkeypatch.delenv(name, raising=False)
    made = []

    def start(**variables: str) -> Any:
        monkeypatch.setenv(HIST, str(tmp_path / "env.json"))
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        hist = RouterHistogram.from_env(1, 3, 1)
        made.append(hist)
        return hist

    yield start
    for hist in made:
        hist.discard()


def test_env_sets_the_cap(env: Callable[..., Any]) -> None:
    hist = env(TURBOSPARK_ROUTER_TRACE="1", TURBOSPARK_ROUTER_TRACE_CAP="1")
    hist.record(0, [2])
    hist.record(0, [1])
    assert hist.to_json() == (
        '{"num_layers":1,"num_experts":3,"top_k":1,"counts":[[0,1,1]],'
        '"trace":[[2]],"trace_cap":1,"trace_dropped":[1]}'
    )


def test_env_accepts_a_leading_plus_as_rust_does(env: Callable[..., Any]) -> None:
    assert env(TURBOSPARK_ROUTER_TRACE="", TURBOSPARK_ROUTER_TRACE_CAP="+7").trace_cap == 7


@pytest.mark.parametrize("raw", ["0", "-1", "ten", "", " 5", "1.5", "9223372036854775808"])
def test_env_warns_and_ignores_a_bad_cap(env: Callable[..., Any], raw: str) -> None:
    with pytest.warns(RuntimeWarning) as caught:
        hist = env(TURBOSPARK_ROUTER_TRACE="1", TURBOSPARK_ROUTER_TRACE_CAP=raw)
    assert [str(w.message) for w in caught] == [
        f"ignoring {CAP}={raw!r}: not a positive integer (passes per layer); the trace is not capped"
    ]
    assert hist.trace_cap is None
    assert '"trace_cap"' not in hist.to_json()


def test_env_cap_without_the_trace_warns_and_records_counts(env: Callable[..., Any]) -> None:
    with pytest.warns(RuntimeWarning) as caught:
        hist = env(TURBOSPARK_ROUTER_TRACE_CAP="10")
    assert [str(w.message) for w in caught] == [
        f"ignoring {CAP}=10: {TRACE} is not set; there is no trace to cap"
    ]
    assert hist.trace_cap is None and not hist.trace_enabled


def test_env_without_the_cap_is_unbounded(env: Callable[..., Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hist = env(TURBOSPARK_ROUTER_TRACE="1")
    assert hist.trace_cap is None


# -- the capped trace is the uncapped one's first N passes, on both cores -----


@st.composite
def _runs(draw: Any) -> tuple[int, int, int, list[tuple[Any, ...]]]:
    layers, experts, k = draw(st.integers(1, 3)), draw(st.integers(2, 6)), draw(st.integers(1, 2))
    row = st.lists(st.integers(0, experts - 1), min_size=k, max_size=k)
    block = st.lists(row, min_size=0, max_size=5)
    layer = st.integers(0, layers - 1)
    op = st.one_of(
        st.tuples(st.just("record"), layer, row),
        st.tuples(st.just("record_prediction"), layer, row),
        st.tuples(st.just("record_many"), layer, block),
        st.tuples(st.just("record_prediction_many"), layer, block),
        st.tuples(st.just("record_batch"), layer, block, st.lists(st.integers(0, 9), min_size=5, max_size=5),
                  st.sampled_from(["prompt", "decode"])),
    )
    return layers, experts, k, draw(st.lists(op, max_size=25))


def _play(hist: Any, ops: list[tuple[Any, ...]], k: int) -> None:
    for op in ops:
        name, layer, payload = op[:3]
        if name in ("record_many", "record_prediction_many", "record_batch"):
            payload = np.array(payload, dtype=np.int64).reshape(len(payload), k)
        if name == "record_batch":
            hist.record_batch(layer, payload, seq=op[3][: len(payload)], phase=op[4])
        else:
            getattr(hist, name)(layer, payload)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run=_runs(), cap=st.integers(1, 6))
def test_capped_equals_the_uncapped_prefix_on_both_cores(cores: Any, tmp_path: Any, run: Any, cap: int) -> None:
    layers, experts, k, ops = run
    made = []
    try:
        for core_cls in cores:
            capped = core_cls(str(tmp_path / "a.json"), layers, experts, k, trace=True, pilot="next", trace_cap=cap)
            full = core_cls(str(tmp_path / "b.json"), layers, experts, k, trace=True, pilot="next")
            made += [capped, full]
            _play(capped, ops, k)
            _play(full, ops, k)
            a, b = turbospark.loads(capped.to_json()), turbospark.loads(full.to_json())
            assert np.array_equal(a.counts, b.counts)
            assert np.array_equal(capped.passes, full.passes)
            passes = full.passes
            assert a.trace_dropped.tolist() == (passes - np.minimum(passes, cap)).tolist()
            for layer in range(layers):
                assert np.array_equal(a.trace[layer], b.trace[layer][:cap])
                assert np.array_equal(a.pred[layer], b.pred[layer][:cap])
                if b.seq is not None:
                    assert np.array_equal(a.seq[layer], b.seq[layer][:cap])
                    assert np.array_equal(a.phase[layer], b.phase[layer][:cap])
            assert turbospark.analyze(a)["checks"]["trace_matches_counts"] is True
        assert made[0].to_json() == made[2].to_json()  # compiled and pure-Python cores, byte for byte
    finally:
        for hist in made:
            hist.discard()


def test_a_capped_trace_stays_bounded_in_a_child(tmp_path: Any) -> None:
    # 4 layers x 1 M passes x top-8: 128 MiB of trace uncapped; capped at 100 passes, a few KiB
    # (plus one block of spare room per layer). Peak RSS must not grow by anything near the uncapped size.
    code = """
        import resource
        import numpy as np
        from turbospark import RouterHistogram
        block = (np.arange(4096 * 8, dtype=np.int32).reshape(4096, 8) % 64)
        hist = RouterHistogram(os.path.join(sys.argv[1], "big.json"), 4, 64, 8, trace=True, trace_cap=100)
        hist.record_many(0, block)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for _ in range(245):
            for layer in range(4):
                hist.record_many(layer, block)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(grown, hist.passes.tolist(), hist.trace_dropped.tolist(), hist.trace(3).shape)
        hist.discard()
    """
    result = run_script(tmp_path, code, str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr
    grown, rest = result.stdout.split(" ", 1)
    assert rest == "[1007616, 1003520, 1003520, 1003520] [1007516, 1003420, 1003420, 1003420] (100, 8)\n"
    assert int(grown) < 16 * 1024, f"peak RSS grew by {grown} KiB while recording a capped trace"
