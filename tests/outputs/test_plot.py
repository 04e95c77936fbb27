"""``turbospark plot``: what each panel shows, checked on the figure's own artists."""

from __future__ import annotations

import pathlib
import struct
from typing import Any

import numpy as np
import pytest

from conftest import require_module
from turbospark.capture.reader import loads
from turbospark.cli.simulate import RouterSimulator

SMALL = loads(
    '{"num_layers":3,"num_experts":4,"top_k":2,"counts":[[1,1,1,1],[2,1,1,0],[0,0,0,0]],'
    '"trace":[[0,1,2,3],[0,1,0,2],[]],"pred":[[],[0,1,0,2],[]]}'
)


@pytest.fixture(scope="module")
def plot() -> Any:
    require_module("matplotlib")
    from turbospark.outputs import plot as module

    return module


def panel(figure: Any, title: str) -> Any:
    """The axes whose title starts with ``title``."""
    (axes,) = [a for a in figure.axes if a.get_title().startswith(title)]
    return axes


def realistic() -> Any:
    """58 layers x 256 experts, top-8: the shape of a large fine-grained MoE, simulated."""
    selected, _ = RouterSimulator(58, 256, 8, seed=3).run(300)
    counts = [np.bincount(layer.ravel(), minlength=256).tolist() for layer in selected]
    return loads('{"num_layers":58,"num_experts":256,"top_k":8,"counts":' + str(counts).replace(" ", "") + "}")


def test_relative_share_is_share_times_num_experts(plot: Any) -> None:
    ratio = plot.relative_share(SMALL)
    assert ratio[:2].tolist() == [[1.0, 1.0, 1.0, 1.0], [2.0, 1.0, 1.0, 0.0]]
    assert np.isnan(ratio[2]).all()


def test_the_heatmap_shows_the_tail_of_a_realistic_capture(plot: Any) -> None:
    from matplotlib.colors import LogNorm

    figure = plot.build_figure(realistic())
    image = panel(figure, "selection share relative to uniform routing").images[0]
    assert isinstance(image.norm, LogNorm) and image.norm.vmin * image.norm.vmax == pytest.approx(1.0)
    data = np.ma.getdata(image.get_array())
    picked = data[data > 1e-200]  # experts never picked are drawn apart (black, below the scale)
    shade = np.ma.getdata(image.norm(picked))
    # A linear scale put nearly every cell in the darkest few percent; here the
    # cells spread over the scale and hardly any is clipped at either end.
    assert np.mean((shade > 0.02) & (shade < 0.98)) > 0.97
    assert np.percentile(shade, 75) - np.percentile(shade, 25) > 0.15


def test_the_coverage_curve(plot: Any) -> None:
    axes = panel(plot.build_figure(SMALL), "coverage: selections held by the top-n experts")
    lines = {line.get_label(): line for line in axes.get_lines()}
    mean = lines["mean of 2 routed layers (thin: each)"]
    assert mean.get_xdata().tolist() == [0, 1, 2, 3, 4]
    assert mean.get_ydata().tolist() == [0.0, 0.375, 0.625, 0.875, 1.0]
    assert lines["uniform routing"].get_ydata().tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    # The markers are the layer means of analyze's cov50 / cov90 (2 and 1; 4 and 3).
    assert [text.get_text() for text in axes.texts] == ["50%: 1.5 experts", "90%: 3.5 experts"]
    assert [text.xy for text in axes.texts] == [(1.5, 0.5), (3.5, 0.9)]


def test_the_pilot_panel_labels_its_markers_and_layer_0(plot: Any) -> None:
    axes = panel(plot.build_figure(SMALL), "one-layer-ahead pilot")
    labels = [text.get_text() for text in axes.get_legend().get_texts()]
    assert labels == [
        "exact: share of passes with all top-k right (mean 100.0%)",
        "random baseline K/E = 0.5",
        "recall: share of the actual top-k predicted (mean 100.0%)",
    ]
    assert axes.get_xlabel() == "layer (layer 0 has no prediction: nothing precedes it)"
    assert list(axes.texts) == []  # no loose label to collide with a bar or the baseline


def test_a_realistic_plot_renders_at_full_size(plot: Any, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "routing.png"
    plot.plot_capture(realistic(), out, title="r.json")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1600, 950)
