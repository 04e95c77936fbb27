"""Getting a capture onto disk and keeping it there: the recorder's side of durability.

The sidecar's writer thread (``_stream.py``, trace="stream"), the periodic checkpoint
(``_checkpoint.py``), the writes at exit and the fork rules (``_lifecycle.py``), the
opt-in SIGTERM handler (``_sigterm.py``) and the deferral of SIGINT while a file is
being replaced (``_held.py``). The atomic write itself (``turbospark/_atomic.py``)
sits below every room that writes a file.
"""
