"""One capture file per process: ``{rank}`` and ``{pid}`` in a path, and rank-suffixed paths.

Data- and expert-parallel launchers start one process per rank with the same
environment, so the same ``TURBOSPARK_ROUTER_HIST``; without this the last
writer silently wins. The rank comes from ``torch.distributed`` when torch is
already imported and a process group is initialised (torch is never imported
here), else from the ``RANK`` variable, else 0.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from ._warn import warn_caller

RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
PLACEHOLDERS = ("{rank}", "{pid}")

# Paths already warned about in this process: each says so once.
_warned: set[str] = set()


def _distributed() -> Optional[tuple[int, int]]:
    """(rank, world size) from an initialised torch.distributed, or None."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # noqa: BLE001 -- a half-torn-down process group is "not initialised"
        return None
    return None


def _env_int(name: str) -> Optional[int]:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    text = raw.strip()
    if text.isdigit():
        return int(text)
    warn_caller(f"ignoring {name}={raw!r}: not a non-negative integer")
    return None


def rank_and_world() -> tuple[int, int]:
    """This process's (rank, world size): torch.distributed, else RANK/WORLD_SIZE, else (0, 1)."""
    dist = _distributed()
    if dist is not None:
        return dist
    rank = _env_int(RANK)
    world = _env_int(WORLD_SIZE)
    return (0 if rank is None else rank), (1 if world is None else world)


def beside(path: str, rank: int) -> str:
    """``path`` with ``.rank<N>`` before its extension: ``out/cap.json`` -> ``out/cap.rank3.json``."""
    head, name = os.path.split(path)
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        return f"{path}.rank{rank}"
    return os.path.join(head, f"{stem}.rank{rank}.{ext}")


def per_process(path: str) -> str:
    """The path this process writes for a configured ``path``.

    ``{rank}`` and ``{pid}`` are replaced by the rank and the process id. A
    path without either, in a launch whose world size is above 1, stays as it
    is on rank 0 and gets the rank beside it on every other rank, with one
    ``RuntimeWarning`` per path and process saying so.
    """
    if not any(mark in path for mark in PLACEHOLDERS):
        rank, world = rank_and_world()
        if world <= 1 or rank == 0:
            return path
        moved = beside(path, rank)
        if path not in _warned:
            _warned.add(path)
            warn_caller(
                f"{WORLD_SIZE}={world} and the capture path {path!r} has no {{rank}} or {{pid}}: "
                f"rank {rank} writes {moved!r} instead, so no rank overwrites another"
            )
        return moved
    if "{rank}" in path:
        path = path.replace("{rank}", str(rank_and_world()[0]))
    return path.replace("{pid}", str(os.getpid()))
