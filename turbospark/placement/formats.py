"""Placement files: turbospark's JSON document, SGLang's and TensorRT-LLM's inputs, and reading them back.

* ``sglang``: exactly ``{"physical_to_logical_map": [[...], ...]}``, what
  ``--init-expert-location`` takes; SGLang passes every key on, so nothing
  else is written. SGLang's map has a row per decoder layer: with
  ``first_layer`` D (the model's first D decoder layers are dense), D rows
  of the trivial map come first, then the L MoE layers.
* ``trtllm``: the YAML of TensorRT-LLM's offline EP load balancer:
  ``initial_global_assignments`` (every MoE layer, keyed by its decoder-layer
  index D + l, each a flow list of the slots' experts: the build fails with
  ``KeyError: layer_idx N not found`` on a missing one; a model's MTP (nextn)
  layers are keyed num_hidden_layers + i, after them, and get the trivial
  placement when asked for), ``layer_updates_per_iter: 0``
  and ``num_slots``, keys in that (alphabetical, as ``yaml.dump`` sorts) order.
  Written by hand: no YAML dependency.
* ``json``: turbospark's own document (see ``turbospark.placement.document``).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from ..capture.reader import _shown

__all__ = ["FORMATS", "parse_trtllm", "read_placement", "read_placement_file", "render", "sglang_text", "trtllm_text"]

FORMATS = ("json", "sglang", "trtllm")


def sglang_text(phy2log: np.ndarray, first_layer: int = 0) -> str:
    """The SGLang ``--init-expert-location`` file for an (L, S) map, after ``first_layer`` trivial rows."""
    rows = np.concatenate([trivial_rows(first_layer, phy2log), phy2log]).tolist()
    return json.dumps({"physical_to_logical_map": rows}, separators=(",", ":")) + "\n"


def trivial_rows(count: int, phy2log: np.ndarray) -> np.ndarray:
    """``count`` rows of the trivial map (slot s holds expert s mod E) as wide as ``phy2log``."""
    experts = int(phy2log.max(initial=0)) + 1
    return np.broadcast_to(np.arange(phy2log.shape[1]) % experts, (count, phy2log.shape[1]))


def trtllm_text(phy2log: np.ndarray, first_layer: int = 0, mtp_layers: int = 0) -> str:
    """TensorRT-LLM's EPLB YAML for an (L, S) map: every layer, MoE layer l keyed ``first_layer + l``,
    then ``mtp_layers`` trivial rows for the MTP (nextn) layers, which TensorRT-LLM keys
    num_hidden_layers + i (the build fails with KeyError on a missing one)."""
    lines = ["initial_global_assignments:"]
    rows = np.concatenate([phy2log, trivial_rows(mtp_layers, phy2log)]) if mtp_layers else phy2log
    for layer, row in enumerate(rows.tolist()):
        lines.append(f"  {first_layer + layer}: [{', '.join(map(str, row))}]")
    if not rows.shape[0]:
        lines[0] += " {}"
    lines += ["layer_updates_per_iter: 0", f"num_slots: {phy2log.shape[1]}"]
    return "\n".join(lines) + "\n"


def render(fmt: str, document: dict[str, Any], phy2log: np.ndarray, first_layer: int = 0,
           mtp_layers: int = 0) -> str:
    """The text of a placement in format ``fmt`` (one of ``FORMATS``); ``first_layer``: the decoder-layer
    index of MoE layer 0 (SGLang's and TensorRT-LLM's files number decoder layers); ``mtp_layers``:
    TensorRT-LLM's MTP layers after them."""
    if fmt == "sglang":
        return sglang_text(phy2log, first_layer)
    if fmt == "trtllm":
        return trtllm_text(phy2log, first_layer, mtp_layers)
    return json.dumps(document) + "\n"


_YAML_ROW = re.compile(r"^  (\d+): \[([0-9, ]*)\]$")


def parse_trtllm(text: str) -> tuple[dict[int, list[int]], int]:
    """Read the YAML ``trtllm_text`` writes (block keys, one flow list per layer).

    Returns ({layer: experts}, num_slots). Raises ``ValueError`` naming the
    line that is not in that shape.
    """
    rows: dict[int, list[int]] = {}
    num_slots = None
    section = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line in ("initial_global_assignments:", "initial_global_assignments: {}"):
            section = "assignments"
            continue
        match = _YAML_ROW.match(line)
        if match and section == "assignments":
            values = match.group(2).replace(" ", "")
            rows[int(match.group(1))] = [int(v) for v in values.split(",")] if values else []
            continue
        key, _, value = line.partition(":")
        if key in ("num_slots", "layer_updates_per_iter") and value.strip().isdigit():
            section = None
            if key == "num_slots":
                num_slots = int(value)
            continue
        raise ValueError(f"line {number} is not part of a TensorRT-LLM EPLB file: {_shown(line)}")
    if num_slots is None:
        raise ValueError("no num_slots in the TensorRT-LLM EPLB file")
    return rows, num_slots


def read_placement(
    text: str, num_layers: int, num_experts: int, gpus: int | None, first_layer: int = 0
) -> tuple[np.ndarray, int]:
    """A placement file's (L, S) map and GPU count, checked against a capture's geometry.

    ``text`` is turbospark's JSON (it holds the GPU count), SGLang's JSON or
    TensorRT-LLM's YAML (these need ``gpus``). ``first_layer`` D: the model's
    first D decoder layers are dense, so SGLang's map has D + L rows (the
    first D are dropped) and the YAML's keys run D .. D + L - 1. Raises
    ``ValueError`` naming the problem, and both sides where the file and the
    capture disagree: unreadable file, a JSON document that is not a
    placement (a capture, say), a row count other than D + L, a YAML that
    misses a MoE layer (TensorRT-LLM's build would fail) or has a key outside
    D .. D + L - 1, a turbospark file made for another GPU count than
    ``gpus`` (or whose ``inputs`` is not an object, or ``inputs.gpus`` not a
    positive integer), empty rows, fewer slots than experts, an expert id outside the
    capture, an expert with no slot, slots not divisible by the GPU count.
    Values it quotes are cut to 60 characters.
    """
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
        is_json = False
    else:
        is_json = True
    if isinstance(doc, dict) and "physical_to_logical_map" in doc:
        rows = doc["physical_to_logical_map"]
        inputs = doc.get("inputs")
        inputs = {} if inputs is None else inputs
        if not isinstance(inputs, dict):
            raise ValueError(f"the placement's inputs must be an object, got {_shown(inputs)}")
        made_for = inputs.get("gpus")
        if made_for is not None and (type(made_for) is not int or made_for < 1):
            raise ValueError(f"the placement's inputs.gpus must be a positive integer, got {_shown(made_for)}")
        if gpus is not None and made_for is not None and made_for != gpus:
            raise ValueError(f"the placement was made for {_shown(made_for)} GPUs (its inputs.gpus), "
                             f"not --gpus {gpus}")
        gpus = made_for if gpus is None else gpus
        if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
            raise ValueError("physical_to_logical_map must be a non-empty list of rows")
        if len(rows) != first_layer + num_layers:
            dense = f" after {first_layer} dense layers (--first-moe-layer)" if first_layer else ""
            raise ValueError(f"the placement has {len(rows)} rows, the capture {num_layers} MoE layers{dense}")
        rows = rows[first_layer:]
        if len({len(r) for r in rows}) != 1:
            raise ValueError("the rows of physical_to_logical_map differ in length")
        bad = [v for r in rows for v in r if type(v) is not int][:1]
        if bad:
            raise ValueError(f"physical_to_logical_map must hold integers only, found {_shown(bad[0])}")
        _check_slots(len(rows[0]), num_experts)
        # Range-check as Python ints: an id beyond int64 would overflow numpy, not name itself.
        _check_ids((v for r in rows for v in r), num_experts)
        phy2log = np.array(rows, dtype=np.int64)
    elif is_json:
        raise ValueError(_not_a_placement(doc))
    else:
        phy2log = _trtllm_map(text, num_layers, num_experts, first_layer)
    if gpus is None:
        raise ValueError("this placement file does not say how many GPUs it is for: give --gpus")
    check_map(phy2log, num_layers, num_experts, gpus)
    return phy2log, int(gpus)


def _trtllm_map(text: str, num_layers: int, num_experts: int, first_layer: int) -> np.ndarray:
    """The (L, S) map of a TensorRT-LLM YAML whose keys must be exactly D .. D + L - 1."""
    assignments, slots = parse_trtllm(text)
    wanted = range(first_layer, first_layer + num_layers)
    for layer, row in assignments.items():
        if layer not in wanted:
            raise ValueError(f"layer {layer} of the placement is outside the capture's {num_layers} MoE layers "
                             f"(decoder layers {first_layer}..{first_layer + num_layers - 1})")
        if len(row) != slots:
            raise ValueError(f"layer {layer} lists {len(row)} experts, not num_slots={slots}")
        _check_ids(row, num_experts)
    if slots == 0:
        raise ValueError("the placement's rows are empty: every layer needs a slot for each expert")
    missing = [layer for layer in wanted if layer not in assignments]
    if missing:
        raise ValueError(f"the placement has no row for layer {missing[0]} ({len(missing)} of the capture's "
                         f"{num_layers} MoE layers missing): TensorRT-LLM's build fails with KeyError on it")
    _check_slots(slots, num_experts)
    return np.array([assignments[layer] for layer in wanted], dtype=np.int64).reshape(num_layers, slots)


def _check_slots(slots: int, num_experts: int) -> None:
    """Raise ``ValueError`` when a layer has fewer slots than the capture has experts."""
    if 0 < slots < num_experts:
        raise ValueError(f"the placement has {slots} slots per layer, fewer than the capture's {num_experts} experts")


def read_placement_file(path: str, capture: Any, gpus: int | None, first_layer: int = 0) -> tuple[np.ndarray, int]:
    """``read_placement`` of the file at ``path`` against ``capture``'s geometry; raises
    ``ValueError`` prefixed with the path when the file cannot be read or does not fit."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return read_placement(text, capture.num_layers, capture.num_experts, gpus, first_layer)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


_PLACEMENT_FILES = ("a placement file is turbospark place's JSON, SGLang's {\"physical_to_logical_map\": ...} "
                    "or TensorRT-LLM's EPLB YAML")


def _not_a_placement(doc: Any) -> str:
    """Why a JSON document ``doc`` without ``physical_to_logical_map`` is not a placement file."""
    if isinstance(doc, dict) and "counts" in doc and "num_experts" in doc:
        return f"this is a capture, not a placement: {_PLACEMENT_FILES} (make one with turbospark place)"
    if isinstance(doc, dict):
        keys = ", ".join(_shown(key, 20) for key in sorted(doc)[:5]) + (", ..." if len(doc) > 5 else "")
        return f"a JSON object without physical_to_logical_map (keys: {keys or 'none'}): {_PLACEMENT_FILES}"
    return f"a JSON {type(doc).__name__}, not a placement: {_PLACEMENT_FILES}"


def _check_ids(ids: Any, num_experts: int) -> None:
    """Raise ``ValueError`` naming the first id outside 0..num_experts-1 (Python ints, any size)."""
    bad = next((v for v in ids if not 0 <= v < num_experts), None)
    if bad is not None:
        raise ValueError(f"the placement holds expert id {_shown(bad)}, outside 0..{num_experts - 1}")


def check_map(phy2log: np.ndarray, num_layers: int, num_experts: int, gpus: int) -> None:
    """Raise ``ValueError`` unless ``phy2log`` is an (L, S) map of valid experts, each placed, S % gpus == 0."""
    layers, slots = phy2log.shape
    if layers != num_layers:
        raise ValueError(f"the placement has {layers} layers, the capture {num_layers}")
    if slots == 0:
        raise ValueError("the placement's rows are empty: every layer needs a slot for each expert")
    if type(gpus) is not int or gpus < 1 or slots % gpus:
        raise ValueError(f"{slots} slots do not divide over {_shown(gpus)} GPUs")
    low, high = int(phy2log.min()), int(phy2log.max())
    if low < 0 or high >= num_experts:
        raise ValueError(f"the placement holds expert id {low if low < 0 else high}, outside 0..{num_experts - 1}")
    from .dispatch import replica_counts

    missing = np.argwhere(replica_counts(phy2log, num_experts) == 0)
    if missing.size:
        layer, expert = missing[0].tolist()
        raise ValueError(f"expert {expert} of layer {layer} has no slot in the placement")
