"""A fork server for the vLLM tests' child interpreters (a helper module and script, not a test).

Importing vLLM costs ~12 CPU-seconds (torch, dynamo, inductor, transformers), more than a tiny model's
whole engine run, and every test run of ``tests/vllm_child.py`` paid it again. Here one server
interpreter imports vLLM once (``from vllm import LLM, SamplingParams``, all that vllm_child.py
imports) and forks one child per run; each child then starts as a fresh interpreter running the
script would after that import: its own session, working directory, environment (set whole, before any
engine, plugin or turbospark code runs: nothing of vLLM's reads those variables at import), stdin from
/dev/null, stdout and stderr to files, ``sys.argv``, and the script run as ``__main__``. It exits as a
script does (atexit handlers and finalizers run), so a capture written at exit is tested as it is in a
plain process. What a child inherits beyond a fresh process is only the modules already imported.

``ForkServer(env).run(argv, cwd, env, timeout)`` answers like ``childproc.run_isolated``; ``argv`` is
``[sys.executable, SCRIPT, ARGS...]`` or ``[sys.executable, "-c", CODE, ARGS...]`` and ``env`` must give the server's PYTHONPATH (sys.path is the
server's: a different one is refused, and the caller runs that child the plain way).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any, Optional

import pytest

SCRIPT = os.path.abspath(__file__)


class ForkServer:
    """One server interpreter; one run at a time."""

    def __init__(self, env: dict[str, str], startup: float = 600) -> None:
        self.pythonpath = env.get("PYTHONPATH")
        self.proc = subprocess.Popen([sys.executable, SCRIPT], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.lines: queue.Queue[Optional[str]] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        ready = self._next(startup)
        if ready != "READY":
            self.stop()
            pytest.fail(f"the vLLM fork server did not start ({ready!r}); stderr:\n{self.proc.stderr.read()}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def _next(self, timeout: float) -> Optional[str]:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return "TIMEOUT"

    def serves(self, env: dict[str, str]) -> bool:
        return self.proc.poll() is None and env.get("PYTHONPATH") == self.pythonpath

    def run(self, argv: list[str], cwd: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
        assert argv[0] == sys.executable and self.serves(env), (argv, env.get("PYTHONPATH"))
        with tempfile.TemporaryDirectory(prefix="forked-") as folder:
            out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(dict(argv=argv, cwd=cwd, env=env, out=out, err=err)) + "\n")
            self.proc.stdin.flush()
            started = self._next(60)
            if started is None or not started.startswith("{"):
                pytest.fail(f"the vLLM fork server did not fork ({started!r})")
            pid = json.loads(started)["pid"]
            ended = self._next(timeout)
            hung = ended == "TIMEOUT"
            try:
                os.killpg(pid, signal.SIGKILL)  # no straggler outlives the test (the child leads its session)
            except (ProcessLookupError, PermissionError):
                pass
            if hung:
                ended = self._next(60)
            with open(out) as o, open(err) as e:
                stdout, stderr = o.read(), e.read()
            if hung:
                pytest.fail(f"the child interpreter hung for {timeout} s; stderr:\n{stderr}")
            assert ended is not None and ended.startswith("{"), ended
            return subprocess.CompletedProcess(argv, json.loads(ended)["returncode"], stdout, stderr)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.reader.join(10)  # at the end of its output, now the server is gone
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def _serve() -> Optional[dict[str, Any]]:
    """The server's loop; returns in a forked child, with its run's request (None: the server ends)."""
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return request
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
    return None


def _become(request: dict[str, Any]) -> Optional[str]:
    """Make this forked child the fresh interpreter of ``request``; returns the script to run (None: the
    code of ``-c``)."""
    os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["out"], os.O_WRONLY | os.O_CREAT),
                            (2, request["err"], os.O_WRONLY | os.O_CREAT)):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    if request["argv"][1] == "-c":
        sys.argv = ["-c", *request["argv"][3:]]
        sys.path[0] = ""  # as `python -c` puts it
        return None
    script = request["argv"][1]
    sys.argv = request["argv"][1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` puts it
    return script


if __name__ == "__main__":
    import runpy

    from vllm import LLM, SamplingParams  # noqa: F401  (the import every child shares)

    print("READY", flush=True)
    run = _serve()
    if run is None:
        sys.exit(0)
    script = _become(run)
    if script is None:
        import types

        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(run["argv"][2], "<string>", "exec"), main.__dict__)
    else:
        runpy.run_path(script, run_name="__main__")
