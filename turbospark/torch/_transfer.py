"""Device-to-host copies (the one sync of a flush) and the hand-over of staged calls to the recorder."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from ..recording import _sequences
from ._buffers import _NO_PHASE, _PREDICTION, _Host


def _to_host(side: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]], ready: Any = None) -> None:
    """Copy device tensors into (pinned) host tensors on the side stream and wait for them.

    ``ready``: an event recorded after the work that writes the sources (the
    vLLM plugin's flush, which may run on another thread than that work);
    default: what the calling thread's current stream has enqueued so far.
    """
    if side is None:
        for host, dev in pairs:
            host.copy_(dev)
        return
    # The host waits for this copy only, and the buffers are reused after it.
    if ready is None:
        side.wait_stream(torch.cuda.current_stream(side.device))
    else:
        side.wait_event(ready)
    with torch.cuda.stream(side):
        for host, dev in pairs:
            host.copy_(dev, non_blocking=True)
    done = torch.cuda.Event()
    done.record(side)
    done.synchronize()


def _hand_over(hist: Any, item: _Host) -> None:
    # The recorder applies the keep mask itself: it validates only the kept
    # rows, and an error names the row as the call numbered it.
    call = item.call
    if call.kind == _PREDICTION:
        hist.record_prediction_many(call.layer, item.ids, mask=item.keep)
    elif call.phase != _NO_PHASE:
        hist.record_batch(call.layer, item.ids, seq=item.seq, phase=_sequences.PHASE_NAMES[call.phase], mask=item.keep)
    else:
        hist.record_many(call.layer, item.ids, mask=item.keep)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while staged calls are handed over, so a handler never sees one half-moved."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
