"""Checks, when a recorder is created, that its capture can be written where it is asked to go.

Without this a typo in the path costs the whole run: the failure would show
only when the capture is written, at the end. Nothing is created by the
check; it asks the file system the questions the final write will ask.
"""

from __future__ import annotations

import errno
import os
import stat


def _error(code: int, path: str, why: str) -> OSError:
    # OSError(errno, ...) builds the matching subclass (FileNotFoundError, ...).
    # str() of the error reads "[Errno 2] <why>: '<path>'".
    return OSError(code, why, path)


def check_destination(path: str) -> None:
    """Raise the OSError the write to ``path`` would meet, if it is already certain.

    Raises ``FileNotFoundError`` when the directory does not exist,
    ``NotADirectoryError`` when a component of it is a file,
    ``IsADirectoryError`` when ``path`` is a directory, and ``PermissionError``
    when the directory (or, for a device or FIFO written in place, the file)
    is not writable. Every message names ``path``. Returns None otherwise.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise _error(errno.EISDIR, path, "it is a directory")
    if mode is not None and not stat.S_ISREG(mode):
        # Devices and FIFOs are written in place (see _atomic.write_atomic).
        if not os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
            raise _error(errno.EACCES, path, "no permission to write it")
        return
    # Atomic writes create a temporary file beside the target: its directory must take one.
    directory = os.path.dirname(os.path.realpath(path))
    try:
        directory_mode = os.stat(directory).st_mode
    except FileNotFoundError:
        raise _error(errno.ENOENT, path, f"the directory {directory!r} does not exist") from None
    except NotADirectoryError:
        raise _error(errno.ENOTDIR, path, f"a component of {directory!r} is not a directory") from None
    except PermissionError:
        raise _error(errno.EACCES, path, f"no permission to reach {directory!r}") from None
    if not stat.S_ISDIR(directory_mode):
        raise _error(errno.ENOTDIR, path, f"{directory!r} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        raise _error(errno.EACCES, path, f"no permission to create files in {directory!r}")
