"""Reading captures and writing results for the decision commands (place, export, compare, merge, cache, their plots)."""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import os
import sys
from typing import Any, Callable, Iterable, Iterator, Optional

from .._atomic import atomic_output, write_atomic
from ..capture.reader import Capture, load
from ..capture.sequences import Sequences, sequences

__all__ = ["UsageError", "add_verify", "draw_document", "emit", "read_capture", "run_guarded", "verifying",
           "verify_requested"]

# --verify of the command being run: every load the command makes, however deep, reads it.
_VERIFY: contextvars.ContextVar[bool] = contextvars.ContextVar("turbospark_cli_verify", default=False)


def add_verify(parser: argparse.ArgumentParser) -> None:
    """The ``--verify`` option of a command that loads captures."""
    parser.add_argument("--verify", action="store_true",
                        help="check every frame's checksum of a streamed capture's sidecar (by default the frames "
                        "its JSON covers are trusted, and a damaged one is found only by a value out of range)")


@contextlib.contextmanager
def verifying(verify: bool) -> Iterator[None]:
    """Every capture loaded inside the block is loaded with ``verify``."""
    token = _VERIFY.set(verify)
    try:
        yield
    finally:
        _VERIFY.reset(token)


def verify_requested() -> bool:
    return _VERIFY.get()


class UsageError(Exception):
    """A job that cannot be done as asked; its message is printed and the command exits 2."""


def read_capture(path: str, *, with_sequences: bool = False) -> tuple[Capture, Optional[Sequences]]:
    """Load the capture at ``path`` (and its seq/phase when asked); raises ``UsageError`` naming the file."""
    try:
        capture = load(path, verify=verify_requested())
        return capture, (sequences(capture) if with_sequences else None)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None


def emit(text: str, output: Optional[str]) -> None:
    """Write ``text`` atomically to ``output``, or to stdout when it is None or "-"."""
    if output is None or output == "-":
        sys.stdout.write(text)
        return
    try:
        write_atomic(output, text.encode("utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from None


def emit_pieces(pieces: Iterable[str], output: Optional[str]) -> None:
    """``emit`` of the text ``pieces`` make, written as they come (a merged capture need not fit in memory)."""
    if output is None or output == "-":
        for piece in pieces:
            sys.stdout.write(piece)
        return
    try:
        with atomic_output(output) as handle:
            for piece in pieces:
                handle.write(piece.encode("utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from None


def draw_document(path: str, output: str, read: Callable[[str], Any], plot: Callable[..., None]) -> int:
    """``plot --placement`` / ``--cache``: ``read(path)``, then ``plot(doc, output, title=...)``; returns the
    exit status (2 with a ``turbospark:`` line for an unreadable document, no matplotlib or an unwritable image)."""
    from ..outputs.plot import MissingMatplotlib

    try:
        doc = read(path)
    except (OSError, ValueError) as exc:
        print(f"turbospark: cannot read {path}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return 2
    try:
        plot(doc, output, title=os.path.basename(path))
    except MissingMatplotlib as exc:
        print(f"turbospark: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"turbospark: cannot write {output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {output}")
    return 0


def run_guarded(job: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run ``job(args)``; a ``UsageError`` or ``ValueError`` (bad settings, files that do not fit
    together) prints ``turbospark: MESSAGE`` on stderr and gives exit 2."""
    try:
        return int(job(args))
    except (UsageError, ValueError) as exc:
        print(f"turbospark: {exc}", file=sys.stderr)
        return 2
