"""Memory of a long-running capture: O(layers), not O(passes) (issue 25 section 3).

A streamed recorder's summary and a capped recorder's JSON must not cost
memory that grows with the passes recorded: a run of days records billions.
Each check runs in a child process whose address space is capped just above
what it holds before the document is built, so an allocation sized by the
passes ever recorded fails there (MemoryError) instead of passing unnoticed
on a machine with memory to spare. Both cores: the child uses this process's
backend (tests/childproc.py).
"""

from __future__ import annotations

from pathlib import Path

from childproc import run_script

# 2**25 tagged passes of one layer: a document sized at 22 bytes per pass ever recorded would need
# 704 MiB, far above the 256 MiB the child may still map; the bounded one needs a few hundred bytes.
_SUMMARY = """
import resource
import numpy as np
from turbospark.recording._backend import RecorderCore
BLOCK, BLOCKS = 1 << 20, 32
ids = np.zeros((BLOCK, 1), dtype=np.int64)
seq = np.arange(BLOCK, dtype=np.int64)

def headroom(extra):
    # The address space this process may still map: what it maps now plus ``extra``.
    with open('/proc/self/status') as status:
        size = next(int(line.split()[1]) for line in status if line.startswith('VmSize:')) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + extra, resource.RLIM_INFINITY))

# A streamed core (what trace="stream" builds): every block's rows are taken out, as the writer does.
core = RecorderCore(1, 1, 1, True, None, -1, 0)
core._stream_every(1 << 62)  # the test takes the chunks itself
for _ in range(BLOCKS):
    core.record_batch(0, ids, seq=seq, phase="decode")
    core._take_chunk()
core.record_batch(0, ids[:3], seq=[7, 8, 9], phase="prompt")
headroom(256 << 20)
head, width, rows, logits, _ = core._take_chunk()
print(head.decode())
print(rows[0][0], np.frombuffer(rows[0][3], dtype=np.int64).tolist(), list(rows[0][4]))
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

# A capped recorder with tags: its JSON holds the first trace_cap passes, whatever the run's length.
hist = R(sys.argv[1], 1, 1, 1, trace=True, trace_cap=2)
for _ in range(BLOCKS):
    hist.record_batch(0, ids, seq=seq, phase="decode")
headroom(256 << 20)
print(hist.to_json())
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
hist.close()
"""


def test_a_streamed_summary_and_a_capped_json_do_not_grow_with_the_tagged_passes(tmp_path: Path) -> None:
    result = run_script(tmp_path, _SUMMARY, str(tmp_path / "capped.json"), timeout=240)
    assert result.returncode == 0, result.stderr
    passes = 32 << 20
    assert result.stdout.splitlines() == [
        f'{{"num_layers":1,"num_experts":1,"top_k":1,"counts":[[{passes + 3}]]',
        f"{passes} [7, 8, 9] [0, 0, 0]",
        f'{{"num_layers":1,"num_experts":1,"top_k":1,"counts":[[{passes}]],"trace":[[0,0]],"trace_cap":2,'
        f'"trace_dropped":[{passes - 2}],"seq":[[0,1]],"phase":[[1,1]]}}',
    ]
