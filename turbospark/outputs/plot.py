"""``turbospark plot``: one PNG with the pictures a capture is read for.

* top: layer x expert selection share relative to uniform routing (share x E),
  on a log colour scale centred on 1, so the tail of rarely picked experts
  shows as well as the hot ones;
* bottom left: coverage, the share of a layer's selections held by its top-n
  experts against n, each layer and their mean, against uniform routing;
* bottom middle: mean distinct experts per window of M passes against M, with
  the uniform-routing estimate E (1 - (1 - K/E)^M) and M x top_k beside it;
* bottom right: pilot recall per layer against the random baseline K / E.

matplotlib is an optional dependency (``pip install 'turbospark[plot]'``) and
is imported here only, when a plot is drawn. The figure is rendered through
the Agg canvas directly, so pyplot's global state is never touched.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..metrics.layers import coverage, pilot_scores, uniform_window_distinct, window_distinct
from ..capture.reader import Capture
from ..capture.rows import layer_breaks

__all__ = ["INSTALL_HINT", "MissingMatplotlib", "agg_figure", "build_figure", "plot_capture", "relative_share"]

INSTALL_HINT = "plotting needs matplotlib, which is not installed: pip install 'turbospark[plot]'"


class MissingMatplotlib(ImportError):
    """Raised by ``plot_capture`` when matplotlib cannot be imported; its message says how to install it."""


def agg_figure(figsize: tuple[float, float], dpi: int) -> Any:
    """A constrained-layout ``matplotlib.figure.Figure`` on its own Agg canvas (pyplot untouched).

    Raises ``MissingMatplotlib`` without matplotlib. Every figure of the package starts here.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingMatplotlib(INSTALL_HINT) from exc
    figure = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def plot_capture(
    capture: Capture,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    max_window: int = 16,
) -> None:
    """Draw ``capture`` into the image file ``path`` (format from its suffix, PNG usually).

    ``title`` heads the figure (e.g. the capture's file name); ``max_window``
    is the largest M on the window-distinct curve. Raises ``MissingMatplotlib``
    without matplotlib, ``OSError`` when ``path`` cannot be written and
    ``ValueError`` for an image format matplotlib does not know.
    """
    build_figure(capture, title=title, max_window=max_window).savefig(path)


def build_figure(capture: Capture, *, title: str | None = None, max_window: int = 16) -> Any:
    """The figure ``plot_capture`` saves, as a ``matplotlib.figure.Figure`` (e.g. for a notebook).

    Takes the same arguments; raises ``MissingMatplotlib`` without matplotlib.
    """
    figure = agg_figure((16, 9.5), 100)
    grid = figure.add_gridspec(2, 3, height_ratios=(1.15, 1))
    _heatmap(figure, figure.add_subplot(grid[0, :]), capture)
    _coverage(figure.add_subplot(grid[1, 0]), capture)
    _windows(figure.add_subplot(grid[1, 1]), capture, max_window)
    _pilot(figure.add_subplot(grid[1, 2]), capture)
    heading = f"{capture.num_layers} layers x {capture.num_experts} experts, top-{capture.top_k}"
    figure.suptitle(f"{title}: {heading}" if title else heading, fontsize=13)
    return figure


def relative_share(capture: Capture) -> np.ndarray:
    """Each expert's share of its layer's selections times num_experts (1.0 = uniform
    routing), as an (L, E) float64 array; NaN rows for layers that never routed."""
    totals = capture.totals.astype(np.float64)
    ratio = np.full(capture.counts.shape, np.nan)
    routed = totals > 0
    ratio[routed] = capture.counts[routed] * capture.num_experts / totals[routed, None]
    return ratio


# The colour scale spans 1/64x .. 64x of uniform; beyond is clipped to its ends.
_MAX_LOG2_RATIO = 6


def _heatmap(figure: Any, axes: Any, capture: Capture) -> None:
    axes.set_title(
        "selection share relative to uniform routing (share x E; log scale, white = uniform)"
        "\ngrey: layer never routed; black: expert never picked"
    )
    if capture.counts.size == 0:
        _note(axes, "no layers or no experts in this capture")
        return
    import matplotlib  # present: plot_capture imported it already
    from matplotlib.colors import LogNorm

    e = capture.num_experts
    ratio = relative_share(capture)
    # Hot and cold tails matter equally (offloading, pruning): symmetric in log space.
    finite = ratio[np.isfinite(ratio) & (ratio > 0)]
    spread = np.abs(np.log2(finite)).max() if finite.size else 1.0
    limit = 2.0 ** float(np.clip(np.ceil(spread), 1, _MAX_LOG2_RATIO))
    cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="#c8c8c8", under="black")
    shown = np.where(ratio == 0, 1e-300, ratio)  # never picked: below the scale, drawn as `under`
    image = axes.imshow(
        shown, aspect="auto", interpolation="nearest", cmap=cmap, norm=LogNorm(vmin=1 / limit, vmax=limit)
    )
    axes.set_xlabel("expert id")
    axes.set_ylabel("layer")
    _integer_ticks(axes.yaxis, capture.num_layers)
    _integer_ticks(axes.xaxis, e)
    bar = figure.colorbar(image, ax=axes, pad=0.01, fraction=0.04, extend="both")
    ticks = [2.0**p for p in range(-int(np.log2(limit)), int(np.log2(limit)) + 1, 2 if limit > 8 else 1)]
    bar.set_ticks(ticks)
    bar.set_ticklabels([f"{t:g}x" if t >= 1 else f"1/{1 / t:g}x" for t in ticks])
    bar.minorticks_off()
    bar.set_label("share of the layer's selections / (1/E)")


def _coverage(axes: Any, capture: Capture) -> None:
    e = capture.num_experts
    axes.set_title("coverage: selections held by the top-n experts")
    axes.set_xlabel("n, the layer's most-picked experts")
    axes.set_ylabel("share of the layer's selections")
    totals = capture.totals
    routed = totals > 0
    if e == 0 or not routed.any():
        _note(axes, "no routed layers in this capture")
        return
    ordered = -np.sort(-capture.counts[routed], axis=1)
    shares = np.cumsum(ordered, axis=1) / totals[routed, None]
    n = np.arange(0, e + 1)
    curves = np.hstack([np.zeros((shares.shape[0], 1)), shares])
    for curve in curves:
        axes.plot(n, curve, color="tab:blue", alpha=0.15, linewidth=0.8)
    mean = curves.mean(axis=0)
    axes.plot(n, mean, color="tab:blue", linewidth=2, label=f"mean of {curves.shape[0]} routed layers (thin: each)")
    axes.plot(n, n / e, "--", color="tab:orange", label="uniform routing")
    rows = capture.counts[routed]
    for level in ("0.5", "0.9"):
        # The mean of the per-layer counts `analyze` reports (cov50, cov90), on that level's line.
        found = [coverage(row, (level,)) for row in rows]  # never None: routed layers have passes
        needed = float(np.mean([levels[level] for levels in found if levels is not None]))
        y = float(level)
        axes.axhline(y, color="grey", linewidth=0.6, linestyle=":")
        left = needed > 0.45 * e  # keep the label inside the axes
        axes.annotate(
            f"{y:.0%}: {needed:.1f} experts", (needed, y), xytext=(-6 if left else 6, -13),
            textcoords="offset points", ha="right" if left else "left", fontsize=9,
        )
        axes.plot([needed], [y], "o", color="tab:blue", markersize=5,
                  label="fewest experts holding 50% / 90% (layer mean)" if level == "0.5" else None)
    axes.set_xlim(0, e)
    axes.set_ylim(0, 1.02)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=9)


def _windows(axes: Any, capture: Capture, max_window: int) -> None:
    e, k = capture.num_experts, capture.top_k
    axes.set_title("distinct experts per window of M consecutive passes")
    axes.set_xlabel("window M (tokens verified together)")
    axes.set_ylabel("distinct experts (mean over layers)")
    if capture.trace is None:
        _note(axes, "no trace in this capture\n(record with trace=True)")
        return
    sizes = list(range(1, max_window + 1))
    # A streamed capture's gaps break the runs: no window spans one (as in analyze).
    per_layer = [window_distinct(ids, e, sizes, layer_breaks(capture, layer))
                 for layer, ids in enumerate(capture.trace) if len(ids)]
    means = []
    for m in sizes:
        values = [row[m] for row in per_layer if row[m] is not None]
        means.append(float(np.mean(values)) if values else np.nan)
    measured = np.array(means)
    if not np.isfinite(measured).any():
        _note(axes, "no routed passes in the trace")
        return
    xs = np.array(sizes)
    axes.plot(xs, np.minimum(xs * k, e), ":", color="grey", label="M x top_k (no overlap)")
    uniform = [uniform_window_distinct(e, k, m) for m in sizes]
    axes.plot(xs, uniform, "--", color="tab:orange", label="uniform routing E(1-(1-K/E)^M)")
    axes.plot(xs, measured, "o-", color="tab:blue", label="measured")
    axes.set_xlim(0.5, max_window + 0.5)
    axes.set_ylim(0, None)
    _integer_ticks(axes.xaxis, max_window + 1, start=1)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", fontsize=9)


def _pilot(axes: Any, capture: Capture) -> None:
    e, k = capture.num_experts, capture.top_k
    axes.set_title("one-layer-ahead pilot: recall per layer")
    axes.set_xlabel("layer")
    axes.set_ylabel("recall")
    if capture.pred is None or capture.trace is None:
        missing = "predictions" if capture.pred is None else "trace"
        _note(axes, f"no {missing} in this capture\n(record with pilot='next' and trace=True)")
        return
    layers, recall, exact = [], [], []
    for layer in range(1, capture.num_layers):
        r, x = pilot_scores(capture.pred[layer], capture.trace[layer], e)
        if r is not None:
            layers.append(layer)
            recall.append(r)
            exact.append(x)
    if not layers:
        _note(axes, "no layer has both predictions and a trace")
        return
    axes.bar(layers, recall, color="tab:blue",
             label=f"recall: share of the actual top-k predicted (mean {np.mean(recall):.1%})")
    axes.plot(layers, exact, "D", color="tab:green", markersize=4,
              label=f"exact: share of passes with all top-k right (mean {np.mean(exact):.1%})")
    if e:
        axes.axhline(k / e, color="tab:red", linestyle="--", label=f"random baseline K/E = {k / e:.3g}")
    if 0 not in layers:
        # Nothing precedes layer 0, so nothing predicts it: said in the axis label,
        # where it cannot collide with a bar, the baseline or the spine.
        axes.set_xlabel("layer (layer 0 has no prediction: nothing precedes it)")
    # Headroom above 1.0 keeps the legend off the bars.
    axes.set_ylim(0, 1.38)
    axes.set_yticks(np.linspace(0, 1, 6))
    axes.set_xlim(-0.5, capture.num_layers - 0.5)
    _integer_ticks(axes.xaxis, capture.num_layers)
    axes.grid(axis="y", alpha=0.3)
    axes.legend(loc="upper center", fontsize=9, ncol=1, framealpha=0.9)


def _note(axes: Any, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, color="grey")
    axes.set_xticks([])
    axes.set_yticks([])


def _integer_ticks(axis: Any, count: int, start: int = 0) -> None:
    """At most ~16 integer ticks on a 0..count-1 axis."""
    step = max(1, -(-count // 16))
    axis.set_ticks(list(range(start if step == 1 else 0, count, step)))

