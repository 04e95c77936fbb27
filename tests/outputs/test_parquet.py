"""``turbospark export --to parquet`` (outputs/parquet.py, docs/exports.md): the dataset read back by
DuckDB and pyarrow holds every pass exactly (ids, pass index, seq, phase, predictions, counts per
layer), types follow num_experts, and bad requests exit 2 naming the value."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import turbospark
from turbospark.cli import main
from turbospark.outputs.parquet import FORMAT, MissingPyarrow, export_parquet, id_type

from conftest import require_module
from placement_helpers import traced, write_capture
from readme_blocks import block_after, exec_block, working_directory

# Two tagged sequences, a dense layer, predictions one short in layer 2, none for layer 0.
TAGGED = traced(4, 2, [[[0, 1], [2, 3], [1, 0], [2, 0]], [], [[3, 2], [0, 1], [1, 0]]],
                seq=[[7, 9, 7, 9], [], [7, 9, 7]], phase=[[0, 0, 1, 1], [], [0, 0, 1]],
                pred=[[], [], [3, 2, 0, 1]])
# No tags, and a prediction beyond layer 1's passes (a run cut between a probe and its layer).
UNTAGGED = traced(4, 2, [[[3, 0], [1, 2]], [[2, 1]], []], pred=[[], [2, 1, 0, 3], []])


def capture(doc: dict[str, Any]) -> turbospark.Capture:
    return turbospark.loads(json.dumps(doc))


def rows(directory: Path) -> list[tuple[Any, ...]]:
    """Every row as DuckDB reads the dataset, ordered by rank, layer, pass."""
    duckdb = require_module("duckdb")
    query = ("SELECT rank, layer, pass, seq, phase, ids, pred FROM "
             f"read_parquet('{directory}/**/*.parquet', hive_partitioning = true) ORDER BY rank, layer, pass")
    return [tuple(row) for row in duckdb.sql(query).fetchall()]


def expected_rows(rank: int, doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The rows the docs promise for one capture document, built from the document by hand."""
    k, out = doc["top_k"], []
    for layer, flat in enumerate(doc["trace"]):
        pred = doc.get("pred", [[]] * len(doc["trace"]))[layer]
        for p in range(len(flat) // k):
            seq = doc["seq"][layer][p] if "seq" in doc else None
            phase = doc["phase"][layer][p] if "phase" in doc else None
            guess = pred[p * k : (p + 1) * k] if (p + 1) * k <= len(pred) else None
            out.append((rank, layer, p, seq, phase, flat[p * k : (p + 1) * k], guess))
    return out


def test_two_ranks_read_back_by_duckdb_exactly(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    require_module("pyarrow")
    a, b = write_capture(tmp_path / "a.json", TAGGED), write_capture(tmp_path / "b.json", UNTAGGED)
    out = tmp_path / "routing"
    assert main(["export", a, b, "--to", "parquet", "-o", str(out), "--rank", "3"]) == 0
    printed = capfd.readouterr()
    assert printed.out == f"wrote {out}: 10 passes of 2 captures (ranks 3-4) x 3 layers, one file per rank and layer\n"
    assert printed.err == (f"turbospark: note: {b} holds predictions beyond its passes, not exported (no pass to "
                           "align them with; analyze ignores them too): layer 1 1\n")
    assert rows(out) == expected_rows(3, TAGGED) + expected_rows(4, UNTAGGED)
    # Every (rank, layer) is a file, the dense layer too, and nothing else is in the directory.
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == [f"rank={r}/layer={l}/part-0.parquet" for r in (3, 4) for l in range(3)]


def test_counts_seq_phase_and_pass_index_match_the_capture(tmp_path: Path) -> None:
    # A recorded capture (the demo's simulator): bincount per layer is the capture's counts, exactly.
    require_module("pyarrow")
    duckdb = require_module("duckdb")
    from turbospark.cli.demo import run_demo

    path = tmp_path / "demo.json"
    run_demo(str(path), layers=3, experts=300, top_k=4, passes=250, seed=1, pilot="next", progress=None)
    cap = turbospark.load(path)
    export_parquet([("demo.json", cap)], tmp_path / "ds", rows_per_group=64)
    glob = f"read_parquet('{tmp_path}/ds/**/*.parquet', hive_partitioning = true)"
    for layer in range(cap.num_layers):
        found = duckdb.sql(f"SELECT e, count(*) FROM (SELECT unnest(ids) AS e FROM {glob} WHERE layer = {layer}) "
                           "GROUP BY e").fetchall()
        counts = np.zeros(cap.num_experts, dtype=np.int64)
        for expert, n in found:
            counts[expert] = n
        assert counts.tolist() == cap.counts[layer].tolist()
        passes = duckdb.sql(f"SELECT pass, ids, pred FROM {glob} WHERE layer = {layer} ORDER BY pass").fetchall()
        assert [p for p, _, _ in passes] == list(range(cap.trace[layer].shape[0]))
        assert [i for _, i, _ in passes] == cap.trace[layer].tolist()
        held = cap.pred[layer].tolist()
        assert [g for _, _, g in passes] == held + [None] * (len(passes) - len(held))
    types = {row[0]: row[1] for row in duckdb.sql(f"DESCRIBE SELECT * FROM {glob}").fetchall()}
    assert types == {"pass": "BIGINT", "seq": "BIGINT", "phase": "UTINYINT", "ids": "USMALLINT[]",
                     "pred": "USMALLINT[]", "layer": "BIGINT", "rank": "BIGINT"}
    # 250 passes in groups of 64: four row groups per layer.
    pq = require_module("pyarrow.parquet")
    assert pq.ParquetFile(tmp_path / "ds" / "rank=0" / "layer=1" / "part-0.parquet").num_row_groups == 4


def test_pyarrow_reads_the_hive_dataset_and_the_file_metadata(tmp_path: Path) -> None:
    ds = require_module("pyarrow.dataset")
    pq = require_module("pyarrow.parquet")
    export_parquet([("tagged.json", capture(TAGGED))], tmp_path / "ds")
    table = ds.dataset(tmp_path / "ds", format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 7
    assert sorted(zip(table["layer"].to_pylist(), table["pass"].to_pylist(), table["seq"].to_pylist(),
                      table["phase"].to_pylist())) == [
        (0, 0, 7, 0), (0, 1, 9, 0), (0, 2, 7, 1), (0, 3, 9, 1), (2, 0, 7, 0), (2, 1, 9, 0), (2, 2, 7, 1)]
    schema = pq.read_schema(tmp_path / "ds" / "rank=0" / "layer=2" / "part-0.parquet")
    assert str(schema.field("ids").type) == "list<element: uint8>"
    assert json.loads(schema.metadata[b"turbospark"]) == {
        "format": FORMAT, "source": "tagged.json", "rank": 0, "layer": 2, "num_layers": 3, "num_experts": 4,
        "top_k": 2, "passes": 3, "predictions": 2, "unaligned_predictions": 0, "trace_cap": None,
        "trace_dropped": None, "counts": [2, 2, 1, 1], "missing": []}


def test_a_capped_trace_exports_its_kept_passes_and_says_what_it_dropped(tmp_path: Path) -> None:
    pq = require_module("pyarrow.parquet")
    doc = {"num_layers": 1, "num_experts": 4, "top_k": 1, "counts": [[2, 1, 1, 0]], "trace": [[0, 1]],
           "trace_cap": 2, "trace_dropped": [2]}
    export_parquet([("capped.json", capture(doc))], tmp_path / "ds")
    assert [r[2:6] for r in rows(tmp_path / "ds")] == [(0, None, None, [0]), (1, None, None, [1])]
    meta = json.loads(pq.read_schema(tmp_path / "ds/rank=0/layer=0/part-0.parquet").metadata[b"turbospark"])
    assert (meta["passes"], meta["trace_cap"], meta["trace_dropped"], meta["counts"]) == (2, 2, 2, [2, 1, 1, 0])


@pytest.mark.parametrize(("experts", "dtype"), [(1, np.uint8), (256, np.uint8), (257, np.uint16),
                                                (65536, np.uint16), (65537, np.uint32)])
def test_the_id_type_is_the_smallest_that_holds_every_expert(experts: int, dtype: type) -> None:
    assert id_type(experts) == np.dtype(dtype)


def test_the_largest_expert_id_survives_the_narrow_type(tmp_path: Path) -> None:
    require_module("pyarrow")
    doc = traced(256, 2, [[[255, 0], [128, 255]]])
    export_parquet([("wide.json", capture(doc))], tmp_path / "ds")
    assert [r[5] for r in rows(tmp_path / "ds")] == [[255, 0], [128, 255]]


def test_missing_pyarrow_names_the_extra(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    with pytest.raises(MissingPyarrow, match=r"install it with pip install 'turbospark\[parquet\]'"):
        export_parquet([("t.json", capture(TAGGED))], tmp_path / "ds")
    path = write_capture(tmp_path / "t.json", TAGGED)
    assert main(["export", path, "--to", "parquet", "-o", str(tmp_path / "ds")]) == 2
    err = capfd.readouterr().err
    assert err.startswith("turbospark: the Parquet export needs pyarrow (")
    assert err.endswith("install it with pip install 'turbospark[parquet]'\n")
    assert not (tmp_path / "ds").exists()


COUNTS_ONLY = {"num_layers": 1, "num_experts": 4, "top_k": 2, "counts": [[1, 1, 0, 0]]}
OTHER_GEOMETRY = traced(5, 2, [[[0, 1]], [], []])


@pytest.mark.parametrize(("docs", "extra", "message"), [
    ([COUNTS_ONLY], [], "{0} has counts but no trace: a row per pass needs the trace"),
    ([TAGGED, OTHER_GEOMETRY], [], "{1} (3 layers x 5 experts, top-2) does not fit {0} (3 layers x 4 experts, top-2)"),
    ([TAGGED], ["--rank", "-1"], "--rank -1: a rank is 0 or more"),
])
def test_bad_requests_exit_2_naming_the_value(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                              docs: list, extra: list, message: str) -> None:
    require_module("pyarrow")
    paths = [write_capture(tmp_path / f"in{i}.json", doc) for i, doc in enumerate(docs)]
    out = tmp_path / "ds"
    assert main(["export", *paths, "--to", "parquet", "-o", str(out), *extra]) == 2
    err = capfd.readouterr().err
    assert err.startswith("turbospark: " + message.format(*paths)), err
    # Nothing is left behind: no dataset, no staging directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(p).name for p in paths)


def test_the_directory_must_be_new_or_empty(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    require_module("pyarrow")
    path = write_capture(tmp_path / "t.json", TAGGED)
    (tmp_path / "empty").mkdir()
    assert main(["export", path, "--to", "parquet", "-o", str(tmp_path / "empty")]) == 0
    capfd.readouterr()
    assert main(["export", path, "--to", "parquet", "-o", str(tmp_path / "empty")]) == 2
    assert capfd.readouterr().err == (f"turbospark: {tmp_path / 'empty'} exists and is not empty: "
                                      "remove it or name a new directory\n")
    assert main(["export", path, "--to", "parquet"]) == 2
    assert capfd.readouterr().err == ("turbospark: --to parquet writes a directory of files: give -o DIR "
                                      "(like -o routing.parquet)\n")


@pytest.mark.parametrize(("argv", "message"), [
    (["--to", "sglang", "--rank", "1"], "--rank 1: only --to parquet takes a rank"),
    (["SECOND", "--to", "routed-experts", "-o", "x.npz"],
     "--to routed-experts takes one capture, got 2: {0}, {0} (merge them first: turbospark merge)"),
])
def test_the_other_formats_take_one_capture_and_no_rank(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                        argv: list, message: str) -> None:
    path = write_capture(tmp_path / "t.json", TAGGED)
    argv = [path if a == "SECOND" else a for a in argv]
    assert main(["export", path, *argv]) == 2
    assert capfd.readouterr().err == "turbospark: " + message.format(path) + "\n"


def test_the_docs_example_prints_what_the_page_shows(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    require_module("pyarrow")
    require_module("duckdb")
    (tmp_path / "capture.json").write_text(block_after("test: parquet-capture"))
    command = block_after("test: parquet-cli").split()
    assert command[:2] == ["turbospark", "export"]
    with working_directory(tmp_path):
        assert main(command[1:]) == 0
        assert capfd.readouterr().out == block_after("test: parquet-cli-output")
        printed = exec_block(block_after("test: parquet-read"), "docs/exports.md")
    assert printed == block_after("test: parquet-read-output")


def test_the_docs_usage_lines_run(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    require_module("pyarrow")
    install, one, ranks = [line.split("#")[0].split() for line in block_after("test: parquet-usage").splitlines()]
    assert install == ["pip", "install", "'turbospark[parquet]'"]
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '\nparquet = ["pyarrow>=' in pyproject
    for name in ("capture.json", "rank0.json", "rank1.json", "rank2.json"):
        write_capture(tmp_path / name, TAGGED)
    with working_directory(tmp_path):
        assert main(one[1:]) == 0
        assert capfd.readouterr().out.startswith("wrote routing: 7 passes of 1 capture (rank 0)")
        ranks[-1] = "routing2"  # the first line's dataset is there: a second one needs a new directory
        assert main(ranks[1:]) == 0
        assert capfd.readouterr().out.startswith("wrote routing2: 21 passes of 3 captures (ranks 0-2)")


def test_a_streamed_capture_exports_the_rows_of_its_in_memory_twin(tmp_path: Path,
                                                                  capfd: pytest.CaptureFixture[str]) -> None:
    require_module("pyarrow")
    from turbospark import RouterHistogram

    for name, trace in (("s.json", "stream"), ("m.json", True)):
        rng = np.random.default_rng(5)
        hist = RouterHistogram(str(tmp_path / name), 2, 300, 2, trace=trace, pilot="next")  # uint16 ids
        for step in range(40):
            ids = np.argsort(rng.random((3, 300)), axis=1)[:, :2]
            hist.record_batch(step % 2, ids, seq=[step, step, step + 1], phase="decode")
            hist.record_prediction_many((step + 1) % 2, ids)
        hist.close()
        assert main(["export", str(tmp_path / name), "--to", "parquet", "-o", str(tmp_path / name[0])]) == 0
    assert rows(tmp_path / "s") == rows(tmp_path / "m")
    assert len(rows(tmp_path / "s")) == 120
