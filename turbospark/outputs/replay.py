"""Routing replay export: a capture's trace as per-token routed experts, the layout RL trainers replay.

``routed_experts(capture)`` turns a traced capture into a ``RoutedExperts``:
for each sequence, its tokens as rows of a ``(tokens, num_layers, top_k)``
block, the blocks of all sequences stacked into one array and cut by
``cu_seqlens``, as vLLM's ``routed_experts`` (one ``(tokens, layers, top_k)``
array per request) packed the way varlen attention packs sequences.
``save_routed_experts`` writes it as an ``.npz`` (no pickled objects) and
``load_routed_experts`` reads one back, checked. The format, and what a
position means, are in docs/replay.md:

* A sequence's token t in layer l is the t-th pass of that sequence in layer
  l's trace, in pass order. Passes are aligned by order: a capture does not
  know absolute positions (prefix-cached prompt tokens are never routed).
* A (token, layer) entry no pass fills (a layer with no passes at all, such
  as a dense layer, or a layer that routed fewer of the sequence's tokens
  than another layer) holds ``fill``, the dtype's maximum, which is never an
  expert id: ``routed_experts`` is uint8 up to 255 experts, uint16 up to
  65,535, uint32 beyond.
* Sequences are the capture's ``seq`` ids in ascending order; a capture
  without sequence tags is one sequence (id 0) and its tokens' phase is -1
  (unknown). Each token's phase is the phase of its pass in the lowest layer
  that routed it.
* A streamed capture that misses rows with kept rows after them (a failed
  append; also a missing head) is refused (``ValueError`` naming the rows):
  the lost passes' sequences are unknown, so every later pass of the layer
  would be aligned with the wrong token. A missing tail is no such gap.
* ``pass_seq`` keeps, per layer, which sequence each pass belonged to in pass
  order, so each layer's trace and seq row are rebuilt exactly
  (``RoutedExperts.layer``).
"""

from __future__ import annotations

import io
import os
import zipfile
from dataclasses import dataclass
from typing import BinaryIO, Optional

import numpy as np

from ..capture.reader import Capture
from ..capture.rows import gap_text
from .._atomic import write_atomic

__all__ = ["FORMAT", "RoutedExperts", "id_dtype", "load_routed_experts", "routed_experts", "save_routed_experts"]

FORMAT = "turbospark-routed-experts/1"
_DTYPES = (np.uint8, np.uint16, np.uint32)
_KEYS = ("format", "routed_experts", "cu_seqlens", "seq_ids", "phase", "routed_layers",
         "pass_seq", "pass_offsets", "fill", "num_experts", "tagged")


def id_dtype(count: int) -> np.dtype:
    """The smallest unsigned dtype whose maximum (the fill) is above ``count - 1``: ids 0..count-1 and
    the fill never collide. uint8 for count <= 255, uint16 for <= 65,535, uint32 for <= 4,294,967,295.

    Raises ``ValueError`` for a negative count or one beyond uint32."""
    if count < 0:
        raise ValueError(f"a count of ids is non-negative, got {count}")
    for dtype in _DTYPES:
        if count <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"{count} ids do not fit uint32 with a fill value")


@dataclass(frozen=True, eq=False)
class RoutedExperts:
    """A capture's routing per token (see the module docstring and docs/replay.md).

    ``routed_experts``: (total_tokens, num_layers, top_k) of ``id_dtype(num_experts)``, ``fill`` where no pass.
    ``cu_seqlens``: (num_seqs + 1,) int64 offsets; sequence i is rows ``cu_seqlens[i]:cu_seqlens[i+1]``.
    ``seq_ids``: (num_seqs,) int64, the capture's sequence id of each sequence, ascending.
    ``phase``: (total_tokens,) int8, 0 prompt, 1 decode, -1 unknown (a capture without tags).
    ``routed_layers``: int64 indices of the layers with at least one pass.
    ``pass_seq``: per layer, in pass order, the sequence index (into ``seq_ids``) of each pass, the
    layers one after the other; ``pass_offsets`` (num_layers + 1,) int64 cuts it by layer.
    ``fill``: the dtype's maximum. ``num_experts``: the capture's. ``tagged``: whether the capture had
    sequence tags.
    """

    routed_experts: np.ndarray
    cu_seqlens: np.ndarray
    seq_ids: np.ndarray
    phase: np.ndarray
    routed_layers: np.ndarray
    pass_seq: np.ndarray
    pass_offsets: np.ndarray
    fill: int
    num_experts: int
    tagged: bool

    @property
    def num_layers(self) -> int:
        """Layers, the second axis of ``routed_experts``."""
        return int(self.routed_experts.shape[1])

    @property
    def top_k(self) -> int:
        """Experts per pass, the third axis of ``routed_experts``."""
        return int(self.routed_experts.shape[2])

    @property
    def num_seqs(self) -> int:
        """Sequences: ``len(cu_seqlens) - 1``."""
        return int(self.cu_seqlens.shape[0]) - 1

    def sequence(self, index: int) -> np.ndarray:
        """Sequence ``index``'s (tokens, num_layers, top_k) block (a view): vLLM's per-request array."""
        if not 0 <= index < self.num_seqs:
            raise IndexError(f"sequence index {index} is outside 0..{self.num_seqs - 1}")
        return self.routed_experts[self.cu_seqlens[index] : self.cu_seqlens[index + 1]]

    def layer(self, layer: int) -> tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]:
        """Layer ``layer`` as the capture held it: its trace ((passes, top_k) int64), and its seq and
        phase rows (int64; None when the capture had no tags). The trace and seq are exact; phase is
        each token's (the lowest routing layer's), so exact when the layers agree on it."""
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} is outside 0..{self.num_layers - 1}")
        index = self.pass_seq[self.pass_offsets[layer] : self.pass_offsets[layer + 1]].astype(np.int64)
        rows = self.cu_seqlens[index] + _rank_in_group(index, self.num_seqs)
        ids = self.routed_experts[rows, layer].astype(np.int64)
        if not self.tagged:
            return ids, None, None
        return ids, self.seq_ids[index], self.phase[rows].astype(np.int64)


def routed_experts(capture: Capture) -> RoutedExperts:
    """The capture's trace laid out per token; takes a ``Capture``, returns ``RoutedExperts``.

    Raises ``ValueError`` when the capture has no trace (counts alone do not say which expert routed
    which token), more experts than uint32 can hold beside the fill, or rows missing before kept ones.
    """
    if capture.trace is None:
        raise ValueError("routed experts need the capture's trace: counts alone do not say which token "
                         "went to which expert (record with trace=True)")
    gaps = gap_text(capture, leading=True)
    if gaps is not None:
        raise ValueError(f"routed experts align a sequence's passes across layers by order, but the streamed "
                         f"trace misses rows lost to a failed append, with rows kept after them ({gaps}): the "
                         "lost passes' sequences are unknown, so the later passes would be replayed for the "
                         "wrong tokens")
    dtype = id_dtype(capture.num_experts)
    fill = int(np.iinfo(dtype).max)
    layers, top_k = capture.num_layers, capture.top_k
    tagged = capture.seq is not None
    passes = [int(ids.shape[0]) for ids in capture.trace]
    if tagged:
        assert capture.seq is not None and capture.phase is not None
        seq_ids = np.unique(np.concatenate([np.zeros(0, np.int64), *capture.seq]))
        index = [np.searchsorted(seq_ids, row) for row in capture.seq]
    else:
        # One sequence, id 0; a capture without passes has none.
        seq_ids = np.zeros(1 if any(passes) else 0, dtype=np.int64)
        index = [np.zeros(count, dtype=np.int64) for count in passes]
    num_seqs = int(seq_ids.shape[0])
    # A sequence is as many tokens long as its longest layer row.
    lengths = np.zeros(num_seqs, dtype=np.int64)
    for row in index:
        np.maximum(lengths, np.bincount(row, minlength=num_seqs), out=lengths)
    cu_seqlens = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu_seqlens[1:])
    total = int(cu_seqlens[-1])
    out = np.full((total, layers, top_k), fill, dtype=dtype)
    phase = np.full(total, -1, dtype=np.int8)
    for layer in range(layers):
        rows = cu_seqlens[index[layer]] + _rank_in_group(index[layer], num_seqs)
        out[rows, layer] = capture.trace[layer]
        if tagged:
            assert capture.phase is not None
            # Layers in order: a token keeps the phase of the lowest layer that routed it.
            unset = phase[rows] < 0
            phase[rows[unset]] = capture.phase[layer][unset]
    # Sequence indices need no fill: the smallest dtype that holds num_seqs - 1.
    seq_dtype = id_dtype(max(num_seqs - 1, 0))
    pass_seq = np.concatenate([np.zeros(0, seq_dtype), *(row.astype(seq_dtype) for row in index)])
    pass_offsets = np.zeros(layers + 1, dtype=np.int64)
    np.cumsum(passes, out=pass_offsets[1:])
    routed = np.flatnonzero(np.array(passes, dtype=np.int64)).astype(np.int64)
    return RoutedExperts(out, cu_seqlens, seq_ids, phase, routed, pass_seq, pass_offsets,
                         fill, capture.num_experts, tagged)


def _rank_in_group(index: np.ndarray, groups: int) -> np.ndarray:
    """For each entry, how many earlier entries share its group (index in 0..groups-1)."""
    order = np.argsort(index, kind="stable")
    starts = np.zeros(groups + 1, dtype=np.int64)
    np.cumsum(np.bincount(index, minlength=groups), out=starts[1:])
    rank = np.empty(index.shape[0], dtype=np.int64)
    rank[order] = np.arange(index.shape[0], dtype=np.int64) - starts[index[order]]
    return rank


def to_bytes(replay: RoutedExperts) -> bytes:
    """The ``.npz`` bytes of ``replay`` (np.savez: uncompressed, no pickled objects)."""
    arrays = {
        "format": np.array(FORMAT),
        "routed_experts": replay.routed_experts,
        "cu_seqlens": replay.cu_seqlens,
        "seq_ids": replay.seq_ids,
        "phase": replay.phase,
        "routed_layers": replay.routed_layers,
        "pass_seq": replay.pass_seq,
        "pass_offsets": replay.pass_offsets,
        "fill": np.array(replay.fill, dtype=replay.routed_experts.dtype),
        "num_experts": np.array(replay.num_experts, dtype=np.int64),
        "tagged": np.array(replay.tagged),
    }
    buffer = io.BytesIO()
    # Little-endian on any host, as the format says (a no-op where numpy is native little-endian).
    little = {key: value.astype(value.dtype.newbyteorder("<"), copy=False) for key, value in arrays.items()}
    # No allow_pickle= here: numpy before 2.1 has no such parameter and would store it as an
    # array named "allow_pickle". Arrays of plain dtypes (these) are never pickled.
    assert all(value.dtype.kind != "O" for value in little.values())
    np.savez(buffer, **little)
    return buffer.getvalue()


def save_routed_experts(replay: RoutedExperts, path: str | os.PathLike[str]) -> None:
    """Write ``replay`` to ``path`` as ``.npz``, atomically (a reader never sees half a file).

    Raises ``OSError`` when the file cannot be written."""
    write_atomic(os.fspath(path), to_bytes(replay))


def load_routed_experts(path: str | os.PathLike[str] | BinaryIO) -> RoutedExperts:
    """Read and check a routed-experts ``.npz`` (a path or a binary file object; ``allow_pickle=False``);
    returns ``RoutedExperts``.

    Raises ``OSError`` when it cannot be read and ``ValueError`` naming what is inconsistent."""
    if isinstance(path, (str, os.PathLike)):
        # Our own handle: np.load leaves the file it opened unclosed when the zip is cut short.
        with open(path, "rb") as handle:
            return _load(handle)
    return _load(path)


def _load(handle: BinaryIO) -> RoutedExperts:
    try:
        npz = np.load(handle, allow_pickle=False)
    except (ValueError, EOFError, zipfile.BadZipFile) as exc:
        # Neither a zip nor a .npy (np.load then takes it for a pickle, which it refuses).
        raise ValueError(f"not a routed-experts file (an .npz): {exc}") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise ValueError("not a routed-experts file: a single .npy array, not an .npz")
    with npz:
        missing = [key for key in _KEYS if key not in npz.files]
        if missing:
            raise ValueError(f"not a routed-experts file: missing {', '.join(missing)}")
        try:
            # Native byte order from here on (the file is little-endian).
            arrays = {key: _native(npz[key]) for key in _KEYS}
        except (ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise ValueError(f"not a routed-experts file: an entry cannot be read: {exc}") from None
    return _checked(arrays)


def _native(array: np.ndarray) -> np.ndarray:
    return array.astype(array.dtype.newbyteorder("="), copy=False)


def _checked(a: dict[str, np.ndarray]) -> RoutedExperts:
    """Validate the arrays of a file against the layout of docs/replay.md."""
    if a["format"].shape != () or str(a["format"]) != FORMAT:
        raise ValueError(f"format is {a['format']!r}, expected {FORMAT!r}")
    ids = a["routed_experts"]
    if ids.ndim != 3 or ids.dtype not in _DTYPES:
        raise ValueError(f"routed_experts must be a 3-D uint8/uint16/uint32 array, got {ids.ndim}-D {ids.dtype}")
    for key in ("cu_seqlens", "seq_ids", "routed_layers", "pass_offsets"):
        if a[key].ndim != 1 or a[key].dtype != np.int64:
            raise ValueError(f"{key} must be a 1-D int64 array, got {a[key].ndim}-D {a[key].dtype}")
    for key, dtype in (("fill", ids.dtype), ("num_experts", np.int64), ("tagged", np.bool_)):
        if a[key].shape != () or a[key].dtype != dtype:
            raise ValueError(f"{key} must be a {np.dtype(dtype)} scalar, got shape {a[key].shape} {a[key].dtype}")
    total, layers, _ = ids.shape
    fill, num_experts, tagged = int(a["fill"]), int(a["num_experts"]), bool(a["tagged"])
    if fill != np.iinfo(ids.dtype).max or ids.dtype != id_dtype(num_experts):
        raise ValueError(f"{ids.dtype} with fill {fill} is not the layout for {num_experts} experts")
    cu = a["cu_seqlens"]
    if cu.shape[0] < 1 or cu[0] != 0 or cu[-1] != total or np.any(np.diff(cu) < 0):
        raise ValueError(f"cu_seqlens must rise from 0 to total_tokens={total}")
    num_seqs = cu.shape[0] - 1
    seq_ids = a["seq_ids"]
    if seq_ids.shape[0] != num_seqs or np.any(np.diff(seq_ids) <= 0) or (num_seqs and seq_ids[0] < 0):
        raise ValueError(f"seq_ids must be {num_seqs} ascending non-negative ids, one per sequence")
    if not tagged and seq_ids.tolist() not in ([], [0]):
        raise ValueError(f"an untagged capture is one sequence, id 0, or none; seq_ids are {seq_ids.tolist()}")
    phase = a["phase"]
    allowed = (0, 1) if tagged else (-1,)
    if phase.shape != (total,) or phase.dtype != np.int8 or not np.isin(phase, allowed).all():
        raise ValueError(f"phase must be {total} int8 values in {allowed} ({'' if tagged else 'un'}tagged capture)")
    off = a["pass_offsets"]
    pass_seq = a["pass_seq"]
    if off.shape[0] != layers + 1 or off[0] != 0 or np.any(np.diff(off) < 0) or off[-1] != pass_seq.shape[0]:
        raise ValueError(f"pass_offsets must rise from 0 to len(pass_seq)={pass_seq.shape[0]} over {layers} layers")
    if pass_seq.ndim != 1 or pass_seq.dtype != id_dtype(max(num_seqs - 1, 0)):
        raise ValueError(f"pass_seq must be 1-D {id_dtype(max(num_seqs - 1, 0))}, got {pass_seq.dtype}")
    if pass_seq.size and int(pass_seq.max()) >= num_seqs:
        raise ValueError(f"pass_seq holds sequence index {int(pass_seq.max())}, outside 0..{num_seqs - 1}")
    routed = np.flatnonzero(np.diff(off))
    if not np.array_equal(a["routed_layers"], routed):
        raise ValueError("routed_layers must list exactly the layers with passes")
    # Each layer's passes fill the first rows of each sequence block; every other entry is the fill.
    lengths, longest = np.diff(cu), np.zeros(num_seqs, dtype=np.int64)
    present = np.zeros((total, layers), dtype=bool)
    for layer in range(layers):
        index = pass_seq[off[layer] : off[layer + 1]].astype(np.int64)
        passes = np.bincount(index, minlength=num_seqs)
        if np.any(passes > lengths):
            raise ValueError(f"layer {layer} holds more passes of a sequence than cu_seqlens gives it tokens")
        np.maximum(longest, passes, out=longest)
        present[cu[index] + _rank_in_group(index, num_seqs), layer] = True
    if not np.array_equal(longest, lengths):
        raise ValueError("a sequence is as many tokens long as its longest layer: cu_seqlens disagrees")
    valid = ids < num_experts
    if not np.array_equal(valid, np.broadcast_to(present[:, :, None], ids.shape)) or np.any(ids[~valid] != fill):
        raise ValueError("routed_experts must hold an expert id exactly where pass_seq places a pass, "
                         f"and the fill {fill} everywhere else")
    return RoutedExperts(ids, cu, seq_ids, phase, a["routed_layers"], pass_seq, off, fill, num_experts, tagged)
