"""The exceptions both backends raise, built in one place so their messages match.

The compiled core calls these only on its error paths, so sharing them costs
nothing per successful call and keeps the two backends' messages identical
(the model-based tests compare them).
"""

from __future__ import annotations

from typing import Any


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def layer_type(layer: Any) -> TypeError:
    return TypeError(f"layer must be an integer, got {type(layer).__name__} {_show(layer)}")


def layer_range(layer: int, num_layers: int) -> IndexError:
    return IndexError(f"layer {layer} is out of range for a recorder of {num_layers} layers")


def selection_type(selection: Any) -> TypeError:
    return TypeError(
        "selected expert ids must be a sequence of ints or an integer array, "
        f"got {type(selection).__name__} {_show(selection)}"
    )


def dtype(kind: str) -> TypeError:
    return TypeError(f"selected expert ids must be integers, got an array of dtype {kind}")


def ndim(shape: tuple[int, ...], wanted: str) -> ValueError:
    return ValueError(f"selected expert ids must be {wanted}, got shape {shape}")


def empty() -> ValueError:
    return ValueError("empty selection: a routed pass selects at least one expert")


def length(got: int, top_k: int) -> ValueError:
    return ValueError(f"selection has {got} expert ids but top_k is {top_k}")


def id_type(value: Any, position: int) -> TypeError:
    return TypeError(
        f"expert ids must be integers, got {type(value).__name__} {_show(value)} at position {position}"
    )


def id_range(value: int, position: int, num_experts: int) -> ValueError:
    return ValueError(
        f"expert id {value} at position {position} is out of range for {num_experts} experts"
    )


def logits_length(got: int, num_experts: int) -> ValueError:
    return ValueError(f"a router-logit row has {got} values but num_experts is {num_experts}")


def logits_shape(shape: tuple[int, ...]) -> ValueError:
    return ValueError(f"a router-logit row must be 1-D, got shape {shape}")


def logits_type(values: Any) -> TypeError:
    return TypeError(f"router logits must be numbers, got {type(values).__name__} {_show(values)}")


def device(what: str, device: Any) -> TypeError:
    return TypeError(
        f"{what} are a tensor on device {device}, and the recorder reads host memory: "
        "record device tensors through turbospark.torch, which stages them without a host sync "
        "(or pass a CPU copy)"
    )


def mask_type(mask: Any) -> TypeError:
    return TypeError(f"mask must be a 1-D boolean array or CPU bool tensor, got {type(mask).__name__} {_show(mask)}")


def mask_shape(shape: tuple[int, ...], rows: int) -> ValueError:
    return ValueError(f"mask must be 1-D with one entry per row ({rows}), got shape {shape}")


def closed() -> ValueError:
    return ValueError("the recorder is closed; it records nothing more")
