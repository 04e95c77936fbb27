"""Data-parallel ranks: which of the rows a router wrote are this rank's tokens, step by step.

Each DP rank is its own engine with its own requests; its TP rank 0 records
them into its own file (``{rank}`` is the global rank). What a router's
``capture_fn`` sees in a DP engine (vLLM 0.32) is one of two layouts, and
the rank's per-step token counts (``num_tokens_across_dp``, after DP
padding) tell them apart:

- **local**: the rank's own rows, ``counts[rank]`` of them (its tokens, then
  any DP/CUDA-graph padding). Every quant method with a modular kernel
  (``supports_internal_mk``: unquantized, fp8, ...; the CPU backend's)
  routes before its prepare step gathers the chosen ids of all DP ranks
  (``naive_dp_ep.py``).
- **gathered**: the rows of every DP rank, concatenated in DP-rank order,
  each part ``counts[r]`` rows (``sum(counts)`` in all), when the runner's
  naive dispatch all-gathers hidden states and router logits before routing
  (``MoERunner.do_naive_dispatch_combine``: quant methods without a modular
  kernel). This rank's tokens start at ``sum(counts[:rank])``.

A rank's real tokens are the first ``total_num_scheduled_tokens`` rows of its
part; the rest is padding. The direct hand-over (CPU) reads the layout from
the row counts each step (``RankRows.offset``); the device hand-over cannot
read them before its flush, so it places the rows by the layout the layers'
kernels imply (``RankRows.place``, the same for every layer, checked at
load) and its flush checks every layer's count against it. vLLM's own routed-experts capturer
(``routed_experts_capturer.py``) reads the same two layouts the same way.
Any other row count (layers disagreeing, a part shorter than the step) stops
the engine with an error: a capture is never silently wrong.

The counts come from the runner's ``_determine_batch_execution_and_padding``,
which every forward calls first (``execute_model`` and each ``_dummy_run``:
profiling, warm-up and the dummy batches an idle DP rank runs to keep the
collectives in lockstep). Its ``num_tokens_across_dp`` is already a CPU
tensor (vLLM's own ``.cpu()`` after its all-reduce), so reading it costs no
device sync. The same wrapper marks every routed layer's row count
not-written before the forward runs: rows a dummy batch wrote (the idle
rank's dummy token, or other ranks' gathered tokens) can never pass for a
later step's. Dummy batches themselves are never recorded: they are not
``execute_model`` steps, so ``after_step`` never sees them.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

__all__ = ["RankRows", "describe", "misplaced", "own_offset"]


def own_offset(low: int, high: int, total: int, counts: Optional[Sequence[int]], rank: int) -> Optional[int]:
    """Where this rank's ``total`` rows start among those every routed layer wrote; None for another layout.

    ``low``/``high``: the smallest and largest row count over the routed
    layers; ``counts``: the step's tokens per DP rank after padding (None when
    the step reported none).
    """
    if counts is None or low != high:
        return None
    own = counts[rank]
    if total > own:
        return None
    if high == own:
        return 0
    if high == sum(counts):
        return sum(counts[:rank])
    return None


def _without_counts(rank: int, total: int) -> str:
    return (f"turbospark: data-parallel rank {rank} ran a step of {total} tokens without the per-rank token counts "
            f"(num_tokens_across_dp) vLLM's runner reports before each forward")


def describe(seen: Sequence[int], total: int, counts: Optional[Sequence[int]], rank: int) -> str:
    """Why ``own_offset`` found no layout, for the engine's error."""
    if counts is None:
        return f"{_without_counts(rank, total)}; the rows of the MoE layers ({list(seen)}) cannot be attributed"
    return (f"turbospark: data-parallel rank {rank}: the MoE layers routed {list(seen)} rows for a step of {total} "
            f"tokens, with {list(counts)} tokens per DP rank: neither this rank's own rows ({counts[rank]}) nor every "
            f"rank's gathered rows ({sum(counts)}); this dispatch layout is not supported")


def misplaced(seen: Sequence[int], total: int, counts: Sequence[int], rank: int, gathered: bool) -> str:
    """The device hand-over's error: the row counts a flush read disagree with the layout it placed them by."""
    layout = f"every rank's gathered rows ({sum(counts)})" if gathered else f"this rank's own rows ({counts[rank]})"
    return (f"turbospark: data-parallel rank {rank}: the MoE layers routed {list(seen)} rows for a step of {total} "
            f"tokens, with {list(counts)} tokens per DP rank, where their kernels (do_naive_dispatch_combine="
            f"{gathered}) imply {layout}; this dispatch layout is not supported")


class RankRows:
    """Reads each step's per-rank token counts from the runner; ``offset`` / ``place`` put this rank's rows."""

    def __init__(self, runner: Any, rank: int, mark_unwritten: Callable[[], None]) -> None:
        """Wrap ``runner``'s batch decision; ``mark_unwritten()`` marks the routed layers' counts unwritten.

        (A host write on a CPU worker; a device fill, no sync, on any other.)
        """
        self.rank = rank
        # The counts of the forward that ran last, until a step takes them; the last step's, for its error.
        self._counts: Optional[list[int]] = None
        self._last: Optional[list[int]] = None
        decide = runner._determine_batch_execution_and_padding

        def decide_and_note(*args: Any, **kwargs: Any) -> Any:
            result = decide(*args, **kwargs)
            across = result[3]
            self._counts = None if across is None else across.tolist()
            mark_unwritten()
            return result

        # An instance attribute: this runner only, the class untouched.
        runner._determine_batch_execution_and_padding = decide_and_note

    def offset(self, rows: Any, total: int) -> Optional[int]:
        """This step's offset (``own_offset``) from the routed layers' row counts; consumes the step's counts."""
        counts = self._last = self._counts
        self._counts = None
        return own_offset(min(rows), max(rows), total, counts, self.rank)

    def refusal(self, seen: Sequence[int], total: int) -> str:
        """The error for the step ``offset`` just returned None for."""
        return describe(seen, total, self._last, self.rank)

    def place(self, total: int, gathered: bool) -> tuple[int, int, list[int]]:
        """The device path's placement, before the row counts can be read: (offset, rows every layer must
        report, the step's counts), from the step's counts and the layout the layers' kernels imply.

        Consumes the step's counts; raises RuntimeError when the step
        reported none or this rank's part is shorter than the step.
        """
        counts = self._last = self._counts
        self._counts = None
        if counts is None:
            raise RuntimeError(f"{_without_counts(self.rank, total)}; its rows cannot be placed")
        if total > counts[self.rank]:
            raise RuntimeError(
                f"turbospark: data-parallel rank {self.rank} ran a step of {total} tokens, but vLLM's runner counted "
                f"{counts[self.rank]} for it ({counts} per DP rank); this dispatch layout is not supported")
        if gathered:
            return sum(counts[:self.rank]), sum(counts), counts
        return 0, counts[self.rank], counts
