"""The crash matrix of a streamed recording (issue 25): a child recorder SIGKILLed at a seeded instant (a
record call, a spill's append, an append torn halfway, a checkpoint's fsync or rename, the close), disk full
(ENOSPC) at seeded appends, and a restart (a new recorder on the path a killed run left). Whatever happened,
``turbospark.load`` gives exactly what the JSON says (its counts, passes and lost rows), the rows are the
in-memory twin's (the same calls, recomputed here) less exactly the rows it reports missing, and nothing of
another run is mixed in. The child runs this pass's backend (the compiled core, or the pure one under
TURBOSPARK_PUREPYTHON)."""

from __future__ import annotations

import json
import random
import signal
import textwrap
import warnings
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

import turbospark

from childproc import run_script
from stream_gap_helpers import kept

LAYERS, EXPERTS, K, CALLS = 3, 40, 2, 240

# The recording, as the child makes it and the test recomputes it: per call (layer, rows, seq or None).
RECORDING = f"""
import numpy as np

def recording(seed, tagged):
    rng = np.random.default_rng(seed)
    out = []
    for call in range({CALLS}):
        layer = int(rng.integers(0, {LAYERS}))
        rows = rng.integers(0, {EXPERTS}, (int(rng.integers(1, 9)), {K}))
        seq = rng.integers(0, 6, rows.shape[0]) + 10 * (seed % 7) if tagged else None
        out.append((layer, rows, seq))
    return out
"""

CHILD = RECORDING + """
import errno, json, threading
from turbospark.recording.durable import _stream

cfg = json.loads(sys.argv[1])
_stream.CHUNK_IDS = cfg["chunk"]
events, lock, armed = {}, threading.Lock(), [False]

def event(name):
    # The count of this kind of event since recording began (the recorder's creation is not counted).
    if not armed[0]:
        return 0
    with lock:
        events[name] = events.get(name, 0) + 1
        return events[name]

def kill_at(name):
    if cfg["kill"] == [name, event(name)]:
        os.kill(os.getpid(), signal.SIGKILL)

real_pwrite, real_fsync, real_replace = os.pwrite, os.fsync, os.replace

def pwrite(fd, data, offset):
    n = event("append")
    if n in cfg["enospc"]:
        raise OSError(errno.ENOSPC, "No space left on device")
    if cfg["kill"] == ["append", n]:
        os.kill(os.getpid(), signal.SIGKILL)
    if cfg["kill"] == ["torn", n]:
        data = bytes(data)
        real_pwrite(fd, data[: len(data) // 2], offset)  # half the chunk's frames reach the file
        os.kill(os.getpid(), signal.SIGKILL)
    return real_pwrite(fd, data, offset)

def fsync(fd):
    kill_at("fsync")
    real_fsync(fd)

def replace(a, b):
    kill_at("rename")
    real_replace(a, b)

os.pwrite, os.fsync, os.replace = pwrite, fsync, replace
hist = R(cfg["path"], %d, %d, %d, trace="stream", checkpoint=cfg["checkpoint"])
armed[0] = True
for call, (layer, rows, seq) in enumerate(recording(cfg["seed"], cfg["tagged"])):
    kill_at("record")
    if seq is None:
        hist.record_many(layer, rows)
    else:
        hist.record_batch(layer, rows, seq=seq, phase="decode")
    if call in cfg["writes"]:
        hist.write()  # a checkpoint at a drawn call, beside the thread's at its interval
    if cfg["pause"]:
        time.sleep(cfg["pause"])  # let checkpoints land between the calls
events.clear()
armed[0] = cfg["kill"][0] != "close"
if not armed[0]:
    # In the close: the n-th of its appends, fsyncs and renames together.
    cfg["kill"] = ["any", cfg["kill"][1]]
    armed[0] = True
    def any_kill(name, real):
        def wrapped(*args):
            kill_at("any")
            return real(*args)
        return wrapped
    os.pwrite, os.fsync, os.replace = any_kill("append", pwrite), any_kill("fsync", fsync), any_kill("rename", replace)
hist.close()
""" % (LAYERS, EXPERTS, K)

_NS: dict[str, Any] = {}
exec(RECORDING, _NS)


def _twin(seed: int, tagged: bool) -> tuple[list[np.ndarray], list[Optional[np.ndarray]]]:
    """Per layer, every row the recording's calls give, in order, and their sequence ids (None untagged)."""
    rows: list[list[np.ndarray]] = [[] for _ in range(LAYERS)]
    seqs: list[list[np.ndarray]] = [[] for _ in range(LAYERS)]
    for layer, block, seq in _NS["recording"](seed, tagged):
        rows[layer].append(block)
        if seq is not None:
            seqs[layer].append(seq)
    return ([np.concatenate(r) if r else np.zeros((0, K), np.int64) for r in rows],
            [np.concatenate(s) if s else np.zeros(0, np.int64) for s in seqs] if tagged else [None] * LAYERS)


KINDS = ("record", "append", "torn", "fsync", "rename", "close", "disk full")


def _scenario(rng: random.Random, tmp_path: Path, seed: int, tagged: bool, kind: str) -> dict[str, Any]:
    """A child's settings drawn from ``rng``: the instant of ``kind`` that kills it (every target is one the
    run reaches), which appends fail with ENOSPC, the chunk size and the checkpoints."""
    chunk = rng.choice([16, 48])
    appends = CALLS * 4 * K // chunk // 2  # fewer than the run makes (~4.5 rows a call, a chunk of ~chunk ids)
    # The checkpoints the child writes itself, at drawn calls: each fsyncs the sidecar and renames a JSON.
    writes = sorted(rng.sample(range(CALLS), 4))
    at = {"record": rng.randrange(1, CALLS), "append": rng.randrange(2, appends), "torn": rng.randrange(2, appends),
          "fsync": rng.randrange(1, 2 * len(writes)), "rename": rng.randrange(1, len(writes)),
          "close": rng.randrange(1, 5), "disk full": 0}[kind]
    failing = rng.choice([1, 3]) if kind == "disk full" else rng.choice([0, 1, 3])
    enospc = sorted(rng.sample([n for n in range(2, appends) if not (kind in ("append", "torn") and n == at)],
                               failing))
    checkpoint = rng.choice([None, 0.001, 0.01])
    return {"path": str(tmp_path / "c.json"), "seed": seed, "tagged": tagged, "chunk": chunk,
            "checkpoint": checkpoint, "pause": 0.0002 if checkpoint else 0, "writes": writes,
            "kill": ["none" if kind == "disk full" else kind, at], "enospc": enospc}


def _run(tmp_path: Path, cfg: dict[str, Any]) -> bool:
    """Run the child; True when it was killed. Every drawn target is reached: killed unless ``kind`` is none."""
    result = run_script(tmp_path, CHILD, json.dumps(cfg), timeout=60)
    killed = result.returncode == -signal.SIGKILL
    assert killed == (cfg["kill"][0] != "none") and result.returncode in (0, -signal.SIGKILL), (cfg, result.stderr)
    return killed


def _check(path: Path, rows: list[np.ndarray], seqs: list[Optional[np.ndarray]], killed: bool) -> str:
    """Load ``path`` and check it against the twin's ``rows``; returns the run id."""
    doc = json.loads(path.read_text())
    stream = doc["stream"]
    stated = stream["passes"]
    lost = stream.get("lost_rows") or [[] for _ in range(LAYERS)]
    assert stream.get("lost_passes", [0] * LAYERS) == [sum(b - a for a, b in r) for r in lost]
    sidecar = path.with_name(stream["file"])
    assert sidecar.read_bytes()[24:40].hex() == stream["run"]  # the pair is one run's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        capture = turbospark.load(path)
    for layer in range(LAYERS):
        # The JSON counts every row it says recorded, the lost ones included: they are the twin's first rows.
        assert stated[layer] <= rows[layer].shape[0]
        assert doc["counts"][layer] == np.bincount(rows[layer][:stated[layer]].ravel(), minlength=EXPERTS).tolist()
        missing = [list(r) for r in capture.stream.missing[layer]]
        # Of the rows the JSON covers, exactly those it says lost are missing from disk: none it counts
        # is silently off disk, and it says lost no row it does not count (a later take's, whose append
        # failed while this summary's flush waited for it) nor one the disk holds.
        covered = {i for a, b in missing if a < stated[layer] for i in range(a, min(b, stated[layer]))}
        said = {i for a, b in lost[layer] for i in range(a, b)}
        assert all(b <= stated[layer] for _, b in lost[layer]), (lost[layer], stated[layer])
        assert covered == said, (sorted(covered ^ said), lost[layer])
        got = capture.trace[layer]
        end = got.shape[0] + sum(b - a for a, b in missing)
        assert end >= stated[layer]  # any rows beyond the JSON are recovered ones
        assert got.tolist() == kept(rows[layer][:end], missing).tolist()
        assert capture.counts[layer].tolist() == np.bincount(got.ravel(), minlength=EXPERTS).tolist()
        if seqs[layer] is not None and got.shape[0]:
            assert capture.seq[layer].tolist() == kept(seqs[layer][:end], missing).tolist()
        if not killed:
            # A clean close: every row is in the file or said lost, and the JSON counts them all.
            assert stated[layer] == end == rows[layer].shape[0]
    return str(stream["run"])


@pytest.mark.parametrize("seed", range(2 * len(KINDS)))
def test_a_killed_or_starved_recorder_loads_what_its_json_says(tmp_path: Path, seed: int) -> None:
    kind = KINDS[seed % len(KINDS)]
    cfg = _scenario(random.Random(seed), tmp_path, seed, seed // len(KINDS) == 1, kind)
    killed = _run(tmp_path, cfg)
    _check(tmp_path / "c.json", *_twin(seed, cfg["tagged"]), killed)


@pytest.mark.parametrize("seed", range(4))
def test_a_new_run_on_a_crashed_runs_path_holds_only_its_own_rows(tmp_path: Path, seed: int) -> None:
    rng = random.Random(1000 + seed)
    first = _scenario(rng, tmp_path, 100 + seed, seed % 2 == 0, rng.choice(["record", "append", "torn"]))
    _run(tmp_path, first)
    before = json.loads((tmp_path / "c.json").read_text())["stream"]["run"]
    second = _scenario(rng, tmp_path, 200 + seed, seed % 2 == 1, KINDS[rng.randrange(len(KINDS))])
    killed = _run(tmp_path, second)
    # The second run's rows only (the first run's ids differ: another seed), and its own run id.
    assert _check(tmp_path / "c.json", *_twin(200 + seed, second["tagged"]), killed) != before
