"""``python -m turbospark.llama_cpp [-m MODULE | SCRIPT] [ARGS...]``: run a program unchanged while recording llama.cpp.

As coverage.py's ``coverage run``: the program runs in this interpreter as
``__main__`` (``runpy``), with ``sys.argv`` set to what it would have seen
(``[SCRIPT, ARGS...]``; with ``-m``, the module's file first) and
``sys.path[0]`` its own (the script's folder; with ``-m``, the current
folder). Everything it records goes to ``TURBOSPARK_ROUTER_HIST`` (with
``TURBOSPARK_ROUTER_TRACE`` and the other variables as
``RouterHistogram.from_env`` reads them), written when the program ends,
also by ``sys.exit`` or an exception (a server stopped by SIGINT, or by
SIGTERM when it handles it as uvicorn does, ends that way). The program's
exit status is kept.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Optional, Sequence

USAGE = "usage: TURBOSPARK_ROUTER_HIST=PATH python -m turbospark.llama_cpp [-m MODULE | SCRIPT] [ARGS...]"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the program under ``capture()``; returns its exit status (2 for a usage error, message on stderr)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + (__doc__ or ""), file=sys.stderr if not args else sys.stdout)
        return 2 if not args else 0
    module = None
    if args[0] == "-m":
        if len(args) < 2:
            print(f"python -m turbospark.llama_cpp: -m needs a module name\n{USAGE}", file=sys.stderr)
            return 2
        module, rest = args[1], args[2:]
    else:
        script, rest = args[0], args[1:]
        if not os.path.isfile(script):
            print(f"python -m turbospark.llama_cpp: no such script: {script!r}", file=sys.stderr)
            return 2
    from turbospark.recording import _env

    if not os.environ.get(_env.HIST):
        print(f"python -m turbospark.llama_cpp: set {_env.HIST}=PATH (where the capture is written)\n{USAGE}",
              file=sys.stderr)
        return 2
    from turbospark.llama_cpp._capture import capture

    status = 0
    with capture() as handle:
        try:
            if module is not None:
                sys.argv = [module, *rest]  # run_module puts the module's file first
                sys.path[0] = os.getcwd()
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                sys.argv = [script, *rest]
                sys.path[0] = os.path.dirname(os.path.abspath(script))
                runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            code = exc.code
            status = code if isinstance(code, int) else (0 if code is None else 1)
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)
        if handle is not None and handle.recorder is None:
            print("python -m turbospark.llama_cpp: the program created no llama.cpp context; nothing recorded",
                  file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
