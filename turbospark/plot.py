"""``turbospark plot``: one PNG with the three pictures a capture is read for.

* top: layer x expert selection share (counts / N per layer), a heatmap;
* bottom left: mean distinct experts per window of M passes against M, with
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

from .analysis import pilot_scores, uniform_window_distinct, window_distinct
from .capture import Capture

__all__ = ["INSTALL_HINT", "MissingMatplotlib", "plot_capture"]

INSTALL_HINT = "plotting needs matplotlib, which is not installed: pip install 'turbospark[plot]'"


class MissingMatplotlib(ImportError):
    """Raised by ``plot_capture`` when matplotlib cannot be imported; its message says how to install it."""


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
    without matplotlib and ``OSError`` when ``path`` cannot be written.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingMatplotlib(INSTALL_HINT) from exc

    figure = Figure(figsize=(13, 8.5), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(2, 2, height_ratios=(1.15, 1))
    _heatmap(figure, figure.add_subplot(grid[0, :]), capture)
    _windows(figure.add_subplot(grid[1, 0]), capture, max_window)
    _pilot(figure.add_subplot(grid[1, 1]), capture)
    heading = (
        f"{capture.num_layers} layers x {capture.num_experts} experts, top-{capture.top_k}"
    )
    figure.suptitle(f"{title}: {heading}" if title else heading, fontsize=13)
    figure.savefig(path)


def _heatmap(figure: Any, axes: Any, capture: Capture) -> None:
    axes.set_title("selection share per layer (counts / layer total; grey: never routed)")
    if capture.counts.size == 0:
        _note(axes, "no layers or no experts in this capture")
        return
    totals = capture.totals.astype(np.float64)
    share = np.full(capture.counts.shape, np.nan)
    routed = totals > 0
    share[routed] = capture.counts[routed] / totals[routed, None]
    import matplotlib  # present: plot_capture imported it already

    cmap = matplotlib.colormaps["magma"].with_extremes(bad="#d9d9d9")  # grey: never routed
    # Clip at a high quantile so one dominant expert does not wash out the rest.
    finite = share[np.isfinite(share)]
    top = float(np.quantile(finite, 0.995)) if finite.size else 1.0
    image = axes.imshow(
        share, aspect="auto", interpolation="nearest", cmap=cmap, vmin=0.0, vmax=max(top, 1e-12)
    )
    axes.set_xlabel("expert id")
    axes.set_ylabel("layer")
    _integer_ticks(axes.yaxis, capture.num_layers)
    _integer_ticks(axes.xaxis, capture.num_experts)
    bar = figure.colorbar(image, ax=axes, pad=0.01, fraction=0.04)
    bar.set_label("share of the layer's selections\n(cyan line: uniform, 1/E)")
    if capture.num_experts:
        bar.ax.axhline(1.0 / capture.num_experts, color="cyan", linewidth=2)


def _windows(axes: Any, capture: Capture, max_window: int) -> None:
    e, k = capture.num_experts, capture.top_k
    axes.set_title("distinct experts per window of M consecutive passes")
    axes.set_xlabel("window M (tokens verified together)")
    axes.set_ylabel("distinct experts (mean over layers)")
    if capture.trace is None:
        _note(axes, "no trace in this capture\n(record with trace=True)")
        return
    sizes = list(range(1, max_window + 1))
    per_layer = [window_distinct(ids, e, sizes) for ids in capture.trace if len(ids)]
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
    axes.bar(layers, recall, color="tab:blue", label="recall |pred & actual| / |actual|")
    axes.plot(layers, exact, "D", color="tab:green", markersize=4, label="all top-k exact (share of passes)")
    if e:
        axes.axhline(k / e, color="tab:red", linestyle="--", label=f"random baseline K/E = {k / e:.3g}")
    if 0 not in layers:
        # Nothing precedes layer 0, so nothing predicts it: say so rather than leave a gap.
        axes.text(0, 0.1, "n/a", ha="center", va="bottom", fontsize=8, color="grey")
    # Headroom above 1.0 keeps the legend off the bars.
    axes.set_ylim(0, 1.38)
    axes.set_yticks(np.linspace(0, 1, 6))
    axes.set_xlim(-0.5, capture.num_layers - 0.5)
    _integer_ticks(axes.xaxis, capture.num_layers)
    axes.grid(axis="y", alpha=0.3)
    axes.legend(loc="upper center", fontsize=9, ncol=2, framealpha=0.9)


def _note(axes: Any, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, color="grey")
    axes.set_xticks([])
    axes.set_yticks([])


def _integer_ticks(axis: Any, count: int, start: int = 0) -> None:
    """At most ~16 integer ticks on a 0..count-1 axis."""
    step = max(1, -(-count // 16))
    axis.set_ticks(list(range(start if step == 1 else 0, count, step)))

