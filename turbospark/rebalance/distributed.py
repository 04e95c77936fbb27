"""``turbospark rebalance --dask ADDRESS|local``: the settings of a sweep replayed in parallel on a Dask
distributed cluster (docs/rebalance.md), in as many tasks as the cluster has worker threads.

A setting's replay depends on the capture and its own numbers only: every figure
it produces is computed in the same order whichever settings run beside it
(per layer, in layer order), so the replays a cluster returns are the serial
sweep's, bit for bit, and the document built from them is byte-identical. A task
replays a contiguous share of the settings in one ``replay`` call, so each of its
layers is read once for all its settings, as in the serial sweep.

Each task loads the capture by its path through ``turbospark.metrics.distributed``'s
per-process cache (a worker parses a JSON capture once for all its tasks) and
refuses a file whose version (inode, size, mtime, sidecar bytes read) differs
from the one the client read: a capture rewritten during the job would otherwise
mix two captures in one table. dask itself is imported only by ``connect`` and
``dask_runner`` (``turbospark.metrics.distributed``).
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..capture.sequences import sequences
from ..metrics.distributed import Runner, load_version
from .replay import Replay, Setting, replay
from .steps import form_steps

__all__ = ["replay_settings", "setting_task", "shares"]


def setting_task(path: str, verify: bool, version: tuple[int, ...], batch: Optional[int], gpus: int,
                 settings: Sequence[Setting], groups: int, nodes: int, first_layer: int) -> list[Replay]:
    """The ``Replay`` of each of ``settings`` on the capture at ``path``, in one call (run on a worker).
    Raises ``ValueError`` naming the file when it cannot be read or is no longer the ``version`` the
    client read."""
    capture, seen = load_version(path, verify)
    if seen != version:
        raise ValueError(f"{path} changed while the sweep ran (rewritten, or a live capture that grew): "
                         "run it again on a finished capture")
    steps = form_steps(capture, batch, sequences(capture))
    return replay(capture, steps, gpus, settings, groups=groups, nodes=nodes, first_layer=first_layer)


def shares(settings: Sequence[Setting], tasks: int) -> list[list[Setting]]:
    """``settings`` cut into at most ``tasks`` contiguous shares, their sizes differing by one at most."""
    count = max(1, min(tasks, len(settings)))
    size, extra = divmod(len(settings), count)
    bounds = [i * size + min(i, extra) for i in range(count + 1)]
    return [list(settings[lo:hi]) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]


def replay_settings(run: Runner, path: str, verify: bool, version: tuple[int, ...], batch: Optional[int],
                    gpus: int, settings: Sequence[Setting], tasks: int, *, groups: int = 1, nodes: int = 1,
                    first_layer: int = 0) -> list[Replay]:
    """Every setting's ``Replay``, in the order of ``settings``, from ``tasks`` ``setting_task`` calls through
    ``run`` (``dask_runner(client, setting_task)``)."""
    parts = shares(settings, tasks)
    count = len(parts)
    done = run(setting_task, [path] * count, [verify] * count, [version] * count, [batch] * count,
               [gpus] * count, parts, [groups] * count, [nodes] * count, [first_layer] * count)
    return [result for part in done for result in part]
