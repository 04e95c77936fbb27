"""The streamed trace's sidecar file: layout constants, and the header and frame codecs.

One definition for the writer (``_stream.py``) and the reader
(``capture/streamed.py``); the layout is specified in ``docs/stream.md``.
All integers are little-endian. The file is a 64-byte header, then frames::

    header (64 bytes)
      0  8  magic b"TSTRACE\\0"
      8  2  version (1)
     10  2  header size (64)
     12  1  id width in bytes: 1 (uint8, <= 256 experts), 2 (uint16, <= 65,536), 4 (uint32)
     13  3  reserved (0)
     16  4  num_layers
     20  4  num_experts
     24 16  run id: random bytes the JSON's "stream" member repeats (all 0: written before run ids)
     40 20  reserved (0)
     60  4  CRC-32 of bytes 0..59

    frame (40-byte header, then the payload, padded to a multiple of 8 bytes)
      0  4  magic b"TSFR"
      4  1  kind: 0 passes, 1 predictions, 2 engine steps
      5  1  flags: bit 0 = the passes carry seq/phase tags
      6  2  reserved (0)
      8  4  layer
     12  4  rows
     16  4  width (ids per row: top_k)
     20  4  reserved (0)
     24  8  first: index of the frame's first row among the layer's rows of this kind
     32  4  payload size in bytes (a multiple of 8)
     36  4  CRC-32 of bytes 0..35 and the payload
    payload, kind 0 with tags: seq (rows x int64), then ids (rows x width), then phase (rows x uint8)
    payload, kind 2: rows marked steps x width (= num_layers) uint32, the passes each layer routed in
        each step; layer 0; first = the index of the frame's first step
    payload, otherwise: ids (rows x width)

The sequence ids come first so that they stay 8-byte aligned for a memory map.
A reader stops at the first frame that is cut short or fails its checksum: what
follows it is reported as dropped, never read.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import NamedTuple

import numpy as np

MAGIC = b"TSTRACE\x00"
FRAME_MAGIC = b"TSFR"
VERSION = 1
HEADER_SIZE = 64
FRAME_HEADER_SIZE = 40
PASSES = 0
PREDICTIONS = 1
#: Engine steps (``mark_step``): readers before this kind stop at such a frame and report the rest dropped.
STEPS = 2
STEP_DTYPE = np.dtype("<u4")
TAGGED = 1
SUFFIX = ".trace"

_HEADER = struct.Struct("<8sHHB3xII16s20x")
RUN_BYTES = 16
#: The run id of a sidecar written before run ids (the reserved bytes were 0).
NO_RUN = bytes(RUN_BYTES)
#: The largest num_layers and num_experts the header's 4-byte fields hold.
MAX_FIELD = 2**32 - 1
_FRAME = struct.Struct("<4sBBxxIII4xQI")


def id_bytes(num_experts: int) -> int:
    """The smallest unsigned width (1, 2 or 4 bytes) that holds every id below ``num_experts``."""
    return 1 if num_experts <= 1 << 8 else 2 if num_experts <= 1 << 16 else 4


def id_dtype(width_bytes: int) -> np.dtype:
    return np.dtype({1: "<u1", 2: "<u2", 4: "<u4"}[width_bytes])


def check_sizes(num_layers: int, num_experts: int) -> None:
    """Raise ValueError when the header's 4-byte fields cannot hold the sizes (before any file is made)."""
    for name, value in (("num_layers", num_layers), ("num_experts", num_experts)):
        if not 0 <= value <= MAX_FIELD:
            raise ValueError(f"trace='stream' records {name} up to {MAX_FIELD} (its sidecar header holds 4 bytes), "
                             f"got {name}={value}; use trace=True")


def new_run() -> bytes:
    """A fresh run id: what binds a sidecar to the JSON written beside it."""
    run = os.urandom(RUN_BYTES)
    return run if run != NO_RUN else b"\x01" + run[1:]


def pack_header(num_layers: int, num_experts: int, run: bytes = NO_RUN) -> bytes:
    check_sizes(num_layers, num_experts)
    if len(run) != RUN_BYTES:
        raise ValueError(f"a run id is {RUN_BYTES} bytes, got {len(run)}")
    body = _HEADER.pack(MAGIC, VERSION, HEADER_SIZE, id_bytes(num_experts), num_layers, num_experts, run)
    return body + struct.pack("<I", zlib.crc32(body))


class Header(NamedTuple):
    id_bytes: int
    num_layers: int
    num_experts: int
    run: bytes = NO_RUN


def unpack_header(data: bytes) -> Header:
    """The header of a sidecar (its first 64 bytes); raises ValueError naming what is wrong."""
    if len(data) < HEADER_SIZE:
        raise ValueError(f"the file is {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header")
    magic, version, size, width, layers, experts, run = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError(f"it does not start with {MAGIC!r} (found {magic!r}): not a turbospark trace stream")
    (crc,) = struct.unpack_from("<I", data, HEADER_SIZE - 4)
    if crc != zlib.crc32(data[: HEADER_SIZE - 4]):
        raise ValueError("its header fails its checksum")
    if version != VERSION or size != HEADER_SIZE:
        raise ValueError(f"format version {version} (header size {size}); this turbospark reads version {VERSION}")
    if width not in (1, 2, 4) or width != id_bytes(experts):
        raise ValueError(f"id width {width} bytes does not fit num_experts={experts}")
    return Header(width, layers, experts, run)


def payload_size(kind: int, rows: int, width: int, id_bytes: int, tagged: bool) -> int:
    """The payload bytes of a frame of ``kind`` with ``rows`` x ``width`` values (padded)."""
    if kind == STEPS:
        return padded(rows * width * STEP_DTYPE.itemsize)
    return padded(rows * width * id_bytes + (9 * rows if tagged else 0))


def padded(size: int) -> int:
    return (size + 7) & ~7


def pack_frame(kind: int, flags: int, layer: int, rows: int, width: int, first: int, payload: bytes) -> bytes:
    """A whole frame: header (its checksum over the header's first 36 bytes and ``payload``), payload, padding."""
    payload = payload + b"\x00" * (padded(len(payload)) - len(payload))
    head = _FRAME.pack(FRAME_MAGIC, kind, flags, layer, rows, width, first, len(payload))
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload


class Frame(NamedTuple):
    kind: int
    flags: int
    layer: int
    rows: int
    width: int
    first: int
    payload_size: int
    crc: int


def unpack_frame(data: bytes, offset: int) -> Frame:
    """The frame header at ``offset`` (FRAME_HEADER_SIZE bytes must be there); not checked beyond its layout."""
    magic, kind, flags, layer, rows, width, first, size = _FRAME.unpack_from(data, offset)
    (crc,) = struct.unpack_from("<I", data, offset + FRAME_HEADER_SIZE - 4)
    if magic != FRAME_MAGIC:
        raise ValueError(f"no frame starts here (found {bytes(magic)!r})")
    return Frame(kind, flags, layer, rows, width, first, size, crc)


def frame_crc(data: bytes, offset: int, payload_size: int) -> int:
    """The checksum a frame at ``offset`` should carry, computed from the bytes there."""
    view = memoryview(data)
    head = view[offset: offset + FRAME_HEADER_SIZE - 4]
    payload = view[offset + FRAME_HEADER_SIZE: offset + FRAME_HEADER_SIZE + payload_size]
    return zlib.crc32(payload, zlib.crc32(head))
