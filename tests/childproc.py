"""Running test scripts in child interpreters (a helper module, not a test).

The child imports the same turbospark as the test process, with the same
backend, and runs in its own session: a hang kills its whole process group
(forked workers included) and fails the test, so no stray process outlives it.

Which helper: ``run_script`` (or ``run_with_files``, which also binds the
script's file paths) for a test script after PREAMBLE; ``run_python`` for
``python -c``/``-m``; ``run_isolated`` for any other command or environment.
``split_at`` cuts a child's stderr at a marker line it printed.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
from typing import Optional

import pytest

import turbospark

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(turbospark.__file__)))

PREAMBLE = (
    "import errno, gc, os, signal, sys, tempfile, time\n"
    "import turbospark\n"
    f"assert turbospark.BACKEND == {turbospark.BACKEND!r}, turbospark.BACKEND\n"
    "from turbospark import RouterHistogram as R\n"
    # Interruptions of a write in progress: at_next_fsync(ctrl_c) or
    # at_next_fsync(sigterm) runs the action once, inside the next os.fsync.
    "def at_next_fsync(action):\n"
    "    real = os.fsync\n"
    "    def fsync(fd):\n"
    "        os.fsync = real\n"
    "        action()\n"
    "        real(fd)\n"
    "    os.fsync = fsync\n"
    "def ctrl_c():\n"
    "    raise KeyboardInterrupt\n"
    "def sigterm():\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    # This process image's peak resident memory, KiB: VmHWM, not ru_maxrss, which Linux
    # carries over exec from the (large) pytest process that started the child.
    "def peak_kib():\n"
    "    with open('/proc/self/status') as status:\n"
    "        return next(int(line.split()[1]) for line in status if line.startswith('VmHWM:'))\n"
)


def child_env(extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    """This environment without TURBOSPARK_* settings (but the backend's), importing this turbospark."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURBOSPARK_")}
    if os.environ.get("TURBOSPARK_PUREPYTHON"):
        env["TURBOSPARK_PUREPYTHON"] = os.environ["TURBOSPARK_PUREPYTHON"]
    env["PYTHONPATH"] = PACKAGE_ROOT
    env.update(extra or {})
    return env


def run_isolated(argv: list[str], cwd: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in its own session; on a hang, kill the whole group and fail the test."""
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the child interpreter hung for {timeout} s; stderr:\n{err}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # no straggler outlives the test
        except (ProcessLookupError, PermissionError):
            pass
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def run_python(
    *args: str, cwd: str = PACKAGE_ROOT, env: Optional[dict[str, str]] = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run this interpreter with ``args`` (``-c CODE``, ``-m MODULE ...``) under ``child_env(env)``, isolated.

    ``-c`` and ``-m`` put the working directory first on sys.path: the
    default ``cwd`` is where this turbospark lives, never beside another one.
    """
    return run_isolated([sys.executable, *args], cwd, child_env(env), timeout)


def run_script(
    tmp_path: pathlib.Path, code: str, *args: str, env: Optional[dict[str, str]] = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (after PREAMBLE) as tmp_path/script.py in a fresh interpreter."""
    script = tmp_path / "script.py"
    script.write_text(PREAMBLE + textwrap.dedent(code))
    return run_isolated([sys.executable, str(script), *args], str(tmp_path), child_env(env), timeout)


def run_with_files(
    tmp_path: pathlib.Path,
    code: str,
    files: dict[str, str],
    *args: str,
    env: Optional[dict[str, str]] = None,
    timeout: float = 30,
) -> tuple[subprocess.CompletedProcess[str], list[pathlib.Path]]:
    """``run_script`` with each name of ``files`` bound, in the script, to its file under tmp_path.

    ``files`` maps a script variable to a path relative to tmp_path
    (``{"path": "c.json", "bad": "gone/x.json"}``); the paths come first in
    the script's sys.argv, then ``args``. Returns the result and the paths
    (``pathlib.Path``), in the order of ``files``.
    """
    paths = [tmp_path / name for name in files.values()]
    binding = "".join(f"{name} = sys.argv[{i}]\n" for i, name in enumerate(files, start=1))
    result = run_script(tmp_path, binding + textwrap.dedent(code), *map(str, paths), *args, env=env, timeout=timeout)
    return result, paths


def split_at(stderr: str, marker: str) -> tuple[list[str], list[str]]:
    """stderr lines before and after the first line starting with ``marker`` (which is dropped).

    A child prints ``marker`` to separate what came before it (a forked
    process's output, a script's body) from what came after (its exit).
    """
    lines = stderr.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(marker))
    return lines[:at], lines[at + 1:]


def recording_forever(setup: str, call: str, *, per_call: int, every: int, pause: float) -> str:
    """A script for ``progress_until_killed``: ``setup`` (which makes ``hist``), then ``call`` forever.

    ``passes`` counts the passes recorded (``per_call`` a call); every
    ``every`` passes the script prints ``time.monotonic() passes`` and sleeps
    ``pause`` seconds (so the parent reads its progress as it goes).
    """
    loop = (
        "passes = 0\n"
        "while True:\n"
        f"    {call}\n"
        f"    passes += {per_call}\n"
        f"    if passes % {every} == 0:\n"
        "        print(time.monotonic(), passes, flush=True)\n"
        f"        time.sleep({pause})\n"
    )
    return textwrap.dedent(setup) + loop


def progress_until_killed(tmp_path: pathlib.Path, code: str, *args: str,
                          seconds: float = 3.0) -> tuple[list[tuple[float, int]], float]:
    """Run ``code`` (after PREAMBLE), which prints ``time.monotonic() count`` lines, for ``seconds``, then SIGKILL it.

    Returns the (time, count) lines read and the time of the kill (both on
    the system's monotonic clock, shared by every process).
    """
    import time

    script = tmp_path / "killed.py"
    script.write_text(PREAMBLE + textwrap.dedent(code))
    proc = subprocess.Popen([sys.executable, str(script), *args], cwd=str(tmp_path), env=child_env(),
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    progress: list[tuple[float, int]] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            stamp, count = line.split()
            progress.append((float(stamp), int(count)))
            if progress[-1][0] - progress[0][0] > seconds:
                break
        killed_at = time.monotonic()
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, f"the child exited by itself with {proc.returncode}"
    return progress, killed_at
