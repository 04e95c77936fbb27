"""Atomic file replacement, so a capture on disk is always whole.

The bytes go to a temporary file in the destination's own directory (so the
final ``os.replace`` is a same-filesystem rename), are flushed to disk, and
only then replace the destination; the directory is then flushed too, so the
rename itself survives a power loss. On any failure the temporary file is
removed and an earlier file at the path is left untouched.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import threading
from typing import IO, Iterator

# Temporary files of writes in progress, so a SIGTERM handler that ends the
# process in the middle of one can remove it first.
_temporaries: set[str] = set()
_temporaries_lock = threading.RLock()  # re-entrant: the SIGTERM handler may run inside it


def _forget_in_child() -> None:
    """A forked child has no write in progress (run by _lifecycle's fork hook)."""
    global _temporaries_lock
    _temporaries.clear()
    _temporaries_lock = threading.RLock()



def remove_temporaries() -> None:
    """Delete the temporary files of every write still in progress."""
    with _temporaries_lock:
        leftovers = list(_temporaries)
        _temporaries.clear()
    for temporary in leftovers:
        try:
            os.unlink(temporary)
        except OSError:
            pass


def _umask() -> int:
    # /proc avoids os.umask's set-and-restore, which races with other threads.
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _final_mode(path: str) -> int:
    """Keep an existing file's permissions; a new one gets 0o666 less the umask, as open() would."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def write_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically; raise OSError and leave no temporary file on failure.

    A destination that exists and is not a regular file (``/dev/null``, a
    FIFO, ``/dev/stdout``) is written in place: replacing it would swap a
    device for a regular file.
    """
    with atomic_output(path) as handle:
        handle.write(data)


@contextlib.contextmanager
def atomic_output(path: str) -> Iterator[IO[bytes]]:
    """A binary file whose contents replace ``path`` atomically when the block ends without an exception.

    For output too large to hold in memory first; otherwise as ``write_atomic``.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        with open(path, "wb") as handle:
            yield handle
        return
    # Through symlinks, as a plain write would go: replace the file, not the link.
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    # Short enough for any file system's name limit, whatever the capture's name.
    prefix = "." + os.path.basename(target)[:64] + "."
    try:
        fd, temporary = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    except OSError as exc:
        raise _naming(exc, path) from None
    with _temporaries_lock:
        _temporaries.add(temporary)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, _final_mode(target))
        os.replace(temporary, target)
        fsync_directory(directory)
    except BaseException as exc:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise _naming(exc, path) from None
        raise
    finally:
        with _temporaries_lock:
            _temporaries.discard(temporary)


def fsync_directory(directory: str) -> None:
    """Make ``directory``'s entries durable (a file created or renamed in it); raise OSError.

    Without it a crash can undo a rename whose file is already on disk, or
    lose a new file's name. File systems that cannot sync a directory
    (``EINVAL``) and systems that cannot open one (Windows) are skipped.
    """
    if os.name == "nt":
        return
    fd = os.open(directory or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _naming(error: OSError, path: str) -> OSError:
    """``error`` about the destination ``path`` rather than the temporary file the caller never named."""
    if error.errno is None or not error.strerror:
        return error
    return OSError(error.errno, error.strerror, path)  # OSError(errno, ...) picks the subclass


def describe_os_error(error: BaseException) -> str:
    """An error as Rust's ``io::Error`` displays it (``No such file or directory (os error 2)``)."""
    if isinstance(error, OSError) and error.errno is not None and error.strerror:
        return f"{error.strerror} (os error {error.errno})"
    return str(error) or type(error).__name__
