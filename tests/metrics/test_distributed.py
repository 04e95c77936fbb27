"""``turbospark analyze FILES...`` and ``--dask``: the per-(file, layer) reduction gives the merged
capture's ``analyze --json`` byte for byte (traces, tags, predictions, differing pass counts,
counts only, a capped file), in this process and on a 2-worker Dask cluster; files ``merge``
refuses are refused with its message."""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from turbospark.cli import main
from turbospark.metrics import distributed as distributed_module
from turbospark.metrics.distributed import analyze_files

from conftest import require_module
from placement_helpers import write_capture
from readme_blocks import block_after, working_directory

E, K, L = 70, 3, 4  # two bitset words per pass


def random_doc(rng: np.random.Generator, *, tagged: bool, pred: str, passes: tuple[int, int]) -> dict[str, Any]:
    """A traced capture: layer 2 dense; ``pred`` "none", "aligned" (one per pass) or "ragged" (any length)."""
    counts, trace, preds, seq, phase = [], [], [], [], []
    for layer in range(L):
        n = 0 if layer == 2 else int(rng.integers(*passes))
        # Sticky routing, so windows, reuse and LRU see repeats: draw from a few hot experts.
        hot = rng.choice(E, size=8, replace=False)
        ids = np.stack([rng.choice(hot if rng.random() < 0.7 else np.arange(E), size=K, replace=False)
                        for _ in range(n)]) if n else np.zeros((0, K), dtype=np.int64)
        counts.append(np.bincount(ids.ravel(), minlength=E).tolist())
        trace.append(ids.ravel().tolist())
        q = n if pred == "aligned" else int(rng.integers(0, n + 3))
        guess = np.where(rng.random((q, K)) < 0.6, np.resize(ids, (q, K)) if n else 0, rng.integers(0, E, (q, K)))
        preds.append([] if layer == 0 else [int(g) for g in _distinct_rows(guess)])
        seq.append(rng.integers(0, 5, size=n).tolist())
        phase.append(rng.integers(0, 2, size=n).tolist())
    doc: dict[str, Any] = {"num_layers": L, "num_experts": E, "top_k": K, "counts": counts, "trace": trace}
    if pred != "none":
        doc["pred"] = preds
    if tagged:
        doc["seq"], doc["phase"] = seq, phase
    return doc


def _distinct_rows(rows: np.ndarray) -> list[int]:
    # A prediction is a top-k: K distinct ids; repair duplicates deterministically.
    out = []
    for row in rows.tolist():
        seen: list[int] = []
        for e in row:
            while e in seen:
                e = (e + 1) % E
            seen.append(e)
        out += seen
    return out


def file_sets(seed: int) -> list[list[dict[str, Any]]]:
    rng = np.random.default_rng(seed)
    return [
        # tags and no tags mixed, predictions aligned but the last file's ragged, differing pass counts
        [random_doc(rng, tagged=True, pred="aligned", passes=(20, 60)),
         random_doc(rng, tagged=False, pred="aligned", passes=(1, 10)),
         random_doc(rng, tagged=True, pred="ragged", passes=(30, 90))],
        [random_doc(rng, tagged=False, pred="none", passes=(0, 40)) for _ in range(2)],
        [random_doc(rng, tagged=True, pred="none", passes=(5, 50))],  # one file: analyze of that file
        [random_doc(rng, tagged=False, pred="ragged", passes=(10, 40))],
    ]


def counts_only(rng: np.random.Generator, tagged: bool) -> dict[str, Any]:
    doc = random_doc(rng, tagged=tagged, pred="none", passes=(3, 30))
    del doc["trace"]
    return doc


def json_of(argv: list[str], capfd: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(argv)
    return status, capfd.readouterr().out


def merged_json(tmp_path: Path, paths: list[str], options: list[str], capfd: pytest.CaptureFixture[str]) -> str:
    if len(paths) == 1:
        return json_of(["analyze", paths[0], "--json", *options], capfd)[1]
    out = str(tmp_path / "merged.json")
    assert main(["merge", *paths, "-o", out]) == 0
    capfd.readouterr()
    return json_of(["analyze", out, "--json", *options], capfd)[1]


def write_all(tmp_path: Path, docs: list[dict[str, Any]], tag: str = "") -> list[str]:
    return [write_capture(tmp_path / f"{tag}in{i}.json", doc) for i, doc in enumerate(docs)]


OPTIONS = ["--cache", "2", "--cache", "9", "--window", "1", "--window", "3", "--window", "200"]


@pytest.mark.parametrize("seed", range(3))
def test_many_files_give_the_merged_report_byte_for_byte(tmp_path: Path, seed: int,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    for index, docs in enumerate(file_sets(seed)):
        paths = write_all(tmp_path, docs, f"s{index}")
        expected = merged_json(tmp_path, paths, OPTIONS, capfd)
        status, got = json_of(["analyze", *paths, "--json", *OPTIONS], capfd)
        assert (status, got) == (0, expected), index
        # The text report too: same table, summary and checks.
        text = main(["analyze", *paths, "--cache", "2"]), capfd.readouterr().out
        if len(paths) > 1:
            assert main(["analyze", str(tmp_path / "merged.json"), "--cache", "2"]) == 0
        else:
            assert main(["analyze", paths[0], "--cache", "2"]) == 0
        assert text == (0, capfd.readouterr().out)


def test_counts_only_merges_with_and_without_tags(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(7)
    for index, tags in enumerate([(True, True, True), (True, False)]):
        paths = write_all(tmp_path, [counts_only(rng, t) for t in tags], f"c{index}")
        assert json_of(["analyze", *paths, "--json"], capfd)[1] == merged_json(tmp_path, paths, [], capfd)


def test_requests_maps_give_the_merged_report(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(11)
    docs = [random_doc(rng, tagged=True, pred="none", passes=(5, 40)) for _ in range(3)]
    for index, doc in enumerate(docs):
        # Maps longer than the ids reach (index + 5 entries for ids 0..4): the width merge shifts by.
        doc["requests"] = [{"seq": i, "request": f"r{index}-{i}", "attempt": 0, "start": 0, "prompt": 1}
                           for i in range(5 + index)]
    idle = {"num_layers": L, "num_experts": E, "top_k": K, "counts": [[0] * E] * L, "trace": [[]] * L,
            "requests": []}
    paths = write_all(tmp_path, docs[:2] + [idle, docs[2]], "rq")
    expected = merged_json(tmp_path, paths, OPTIONS, capfd)
    assert '"sequences":' in expected
    assert json_of(["analyze", *paths, "--json", *OPTIONS], capfd) == (0, expected)


def test_a_capped_file_and_pilot_distance(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    capped = {"num_layers": 2, "num_experts": 4, "top_k": 1, "counts": [[2, 1, 1, 0], [1, 0, 0, 0]],
              "trace": [[0, 1], [0]], "pred": [[], [0]], "trace_cap": 2, "trace_dropped": [2, 0],
              "pilot_distance": [0, 1]}
    (path,) = write_all(tmp_path, [capped])
    # One file is analysed as itself, cap and all.
    assert json.dumps(analyze_files([path], [1, 2, 4, 8])[0]) + "\n" == merged_json(tmp_path, [path], [], capfd)
    # Two: merge refuses a capture that dropped passes, and so does analyze, with merge's words.
    assert main(["analyze", path, path, "--json"]) == 2
    assert "its trace is capped at 2 passes per layer and dropped passes (layer 0 2)" in capfd.readouterr().err
    uncapped = {key: value for key, value in capped.items() if key not in ("trace_cap", "trace_dropped")}
    uncapped["counts"] = [[1, 1, 0, 0], [1, 0, 0, 0]]
    paths = write_all(tmp_path, [uncapped, uncapped], "pd")
    assert json_of(["analyze", *paths, "--json"], capfd)[1] == merged_json(tmp_path, paths, [], capfd)


REFUSED = [
    ({"trace": [[0], [0]], "seq": [[0], [0]], "phase": [[1], [1]],
      "requests": [{"seq": 0, "request": "a", "attempt": 0, "start": 0, "prompt": 1}]},
     {"trace": [[0], [0]]}, "has a requests map (the vLLM plugin's)"),
    ({"trace": [[0], [0]], "seq": [[0], [0]], "phase": [[1], [1]],
      "requests": [{"seq": 0, "request": "a", "attempt": 0, "start": 0, "prompt": 1}]},
     {"trace": [[0], [0]], "requests": []}, "it has a requests map but its passes carry no seq tags"),
    ({"trace": [[0], [0]], "pred": [[], []]}, {"trace": [[0], [0]]}, "has predictions (pilot probe)"),
    ({"trace": [[0], [0]], "pred": [[], []]}, {"trace": [[0], [0, 1]], "pred": [[], [1]]}, "would not line up"),
]


@pytest.mark.parametrize(("first", "second", "words"), REFUSED)
def test_files_merge_refuses_are_refused_with_its_message(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                          first: dict, second: dict, words: str) -> None:
    def doc(fields: dict) -> dict:
        counts = [np.bincount(row, minlength=2).tolist() for row in fields["trace"]]
        return {"num_layers": 2, "num_experts": 2, "top_k": 1, "counts": counts, **fields}

    paths = write_all(tmp_path, [doc(first), doc(second)])
    assert main(["merge", *paths, "-o", str(tmp_path / "m.json")]) == 2
    message = capfd.readouterr().err
    assert words in message
    assert main(["analyze", *paths, "--json"]) == 2
    assert capfd.readouterr() == ("", message)


# ---------------------------------------------------------------- on Dask


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """A LocalCluster of 2 single-threaded workers in this process (processes=False: no interpreter
    start-up, nothing to spawn on a 2-core machine), reachable over TCP like any scheduler."""
    distributed = require_module("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp",
                                  dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


def test_dask_gives_the_merged_report_byte_for_byte(tmp_path: Path, scheduler: str,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    for index, docs in enumerate(file_sets(11)):
        paths = write_all(tmp_path, docs, f"d{index}")
        expected = merged_json(tmp_path, paths, OPTIONS, capfd)
        assert json_of(["analyze", "--dask", scheduler, *paths, "--json", *OPTIONS], capfd) == (0, expected)


def test_dask_local_starts_and_stops_its_own_cluster(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    require_module("distributed")
    paths = write_all(tmp_path, file_sets(5)[0])
    expected = merged_json(tmp_path, paths, [], capfd)
    assert json_of(["analyze", "--dask", "local", *paths, "--json"], capfd) == (0, expected)


def test_dask_errors_exit_2_naming_the_problem(tmp_path: Path, scheduler: str, capfd: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distributed_module, "CONNECT_TIMEOUT", "1s")  # port 9 answers nothing: do not wait 10 s
    paths = write_all(tmp_path, file_sets(5)[1])
    missing = str(tmp_path / "nope.json")
    assert main(["analyze", "--dask", scheduler, paths[0], missing, "--json"]) == 2
    assert capfd.readouterr() == ("", f"turbospark: cannot read {missing}: No such file or directory\n")
    assert main(["analyze", "--dask", "tcp://127.0.0.1:9", *paths]) == 2
    assert capfd.readouterr().err.startswith("turbospark: cannot reach the Dask scheduler at 'tcp://127.0.0.1:9': ")
    assert main(["analyze", *paths, "--self-test", "--holdout", "0.5"]) == 2
    assert capfd.readouterr().err == ("turbospark: --self-test, --holdout read one whole capture: with several "
                                      "files or --dask, run them on the merged capture (turbospark merge FILES... "
                                      "-o merged.json)\n")


def test_the_docs_usage_lines_run(tmp_path: Path, scheduler: str, capfd: pytest.CaptureFixture[str]) -> None:
    install, *commands = [line.split("#")[0].split() for line in block_after("test: dask-usage").splitlines()]
    assert install == ["pip", "install", "'turbospark[dask]'"]
    assert '\ndask = ["dask[distributed]>=' in (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    paths = write_all(tmp_path, file_sets(3)[0][:2])
    for index, path in enumerate(paths):
        Path(path).rename(tmp_path / f"rank{index}.json")
    with working_directory(tmp_path):
        expected = merged_json(tmp_path, ["rank0.json", "rank1.json"], [], capfd)
        for argv in commands:
            argv = [scheduler if a == "tcp://scheduler:8786" else a for a in argv]
            argv = [p for a in argv for p in (sorted(glob.glob(a)) if "*" in a else [a])]
            assert json_of(argv[1:], capfd) == (0, expected), argv


def _streamed_and_in_memory(tmp_path: Path, count: int) -> tuple[list[str], list[str]]:
    """``count`` captures recorded twice, streamed and in memory (same calls), in two directories."""
    from turbospark import RouterHistogram
    from turbospark.recording.durable import _stream

    saved = _stream.CHUNK_IDS
    _stream.CHUNK_IDS = 40  # many frames per layer
    paths: dict[str, list[str]] = {"s": [], "m": []}
    try:
        for side, trace in (("s", "stream"), ("m", True)):
            (tmp_path / side).mkdir()
            for index in range(count):
                rng = np.random.default_rng(index)
                path = str(tmp_path / side / f"c{index}.json")
                hist = RouterHistogram(path, 3, 16, 2, trace=trace, pilot="next")
                for step in range(30 + 9 * index):  # whole rounds: every layer as many predictions as passes
                    layer = step % 3
                    ids = np.argsort(rng.random((4, 16)), axis=1)[:, :2]
                    hist.record_batch(layer, ids, seq=[step // 9] * 4, phase="decode" if step > 5 else "prompt")
                    hist.record_prediction_many((layer + 1) % 3, ids)
                hist.close()
                paths[side].append(path)
    finally:
        _stream.CHUNK_IDS = saved
    return paths["s"], paths["m"]


def test_streamed_captures_give_the_in_memory_report_on_dask(tmp_path: Path, scheduler: str,
                                                             capfd: pytest.CaptureFixture[str]) -> None:
    streamed, in_memory = _streamed_and_in_memory(tmp_path, 3)
    expected = json_of(["analyze", *in_memory, "--json"], capfd)
    assert expected[0] == 0
    assert json_of(["analyze", *streamed, "--json"], capfd) == expected
    assert json_of(["analyze", "--dask", scheduler, *streamed, "--json"], capfd) == expected
