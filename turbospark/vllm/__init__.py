"""Recording inside vLLM: a plugin that vLLM loads in every process, a no-op unless recording is asked for.

``TURBOSPARK_ROUTER_HIST=cap-{rank}.json TURBOSPARK_ROUTER_TRACE=1 vllm serve MODEL``
(or the same environment around ``vllm.LLM(...)``) writes a capture of every
request's routing. vLLM finds ``register`` through the ``vllm.general_plugins``
entry point of the turbospark distribution and calls it in the API server, the
engine core and every worker; with ``TURBOSPARK_ROUTER_HIST`` unset it returns
at once and imports nothing. What is recorded, the request map, and what is
refused: docs/vllm.md.

Importing this package imports neither vllm nor torch: the worker side
(``_worker``) is imported only by ``register`` when recording is on.
"""

from __future__ import annotations

from ._plugin import register

__all__ = ["register"]
