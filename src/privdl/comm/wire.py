"""What the loop's collectives put on the wire: plain data, never a pickle.

``torch.distributed``'s object collectives pickle what they send and unpickle what they
receive, so a process that impersonates rank 0 (or any peer) would run code in every other rank.
The loop's collectives (:func:`privdl.comm.distributed.broadcast_object`,
:func:`~privdl.comm.distributed.all_gather_objects`) send :func:`encode` instead: a JSON header
for the structure (dicts, lists, tuples, strings, numbers, ``None``, ``bytes``) followed by the
raw bytes of the tensors it names. :func:`decode` builds only those types back; there is nothing
in the format that names a class or a function.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any

import torch

from privdl.errors import PrivdlError

__all__ = ["WireError", "decode", "encode"]

_MAGIC = b"PDW1"
#: The tensor dtypes a message may carry (a name on the wire, never a class).
_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
        torch.complex128, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
        torch.bool,
    )
}  # fmt: skip


class WireError(PrivdlError):
    """A message that is not privdl's plain-data format (a peer that is not privdl's)."""


def _float(x: float) -> Any:
    return x if math.isfinite(x) else {"f": repr(x)}  # nan, inf, -inf: JSON has no such number


def _pack(obj: Any, blobs: list[bytes]) -> Any:
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return _float(obj)
    if isinstance(obj, bytes):
        return {"b": base64.b64encode(obj).decode()}
    if isinstance(obj, complex):
        return {"c": [_float(obj.real), _float(obj.imag)]}
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        name = str(t.dtype).removeprefix("torch.")
        if name not in _DTYPES:
            raise TypeError(f"cannot send a tensor of dtype {name}")
        blobs.append(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return {"x": len(blobs) - 1, "dtype": name, "shape": list(t.shape)}
    if isinstance(obj, list):
        return [_pack(v, blobs) for v in obj]
    if isinstance(obj, tuple):
        return {"t": [_pack(v, blobs) for v in obj]}
    if isinstance(obj, dict):  # keys of any plain type (checkpoints have int keys)
        return {"d": [[_pack(k, blobs), _pack(v, blobs)] for k, v in obj.items()]}
    raise TypeError(f"only plain data and tensors go on the wire, not {type(obj).__name__}")


def encode(obj: Any) -> bytes:
    """``obj`` (tensors and plain data, as :func:`privdl.records.plain_data` makes them) as
    bytes: magic, header length, JSON header, tensor bytes. Anything else is a TypeError."""
    from privdl.records import plain_data  # numpy arrays and scalars as tensors and numbers

    blobs: list[bytes] = []
    header = json.dumps(
        {"v": _pack(plain_data(obj), blobs), "n": [len(b) for b in blobs]}, allow_nan=False
    ).encode()
    return b"".join([_MAGIC, struct.pack("<Q", len(header)), header, *blobs])


def _unpack(node: Any, blobs: list[bytes]) -> Any:
    if node is None or isinstance(node, bool | int | str):
        return node
    if isinstance(node, float):
        return node
    if isinstance(node, list):
        return [_unpack(v, blobs) for v in node]
    if not isinstance(node, dict) or len(node) not in (1, 3):
        raise WireError("malformed message")
    if "f" in node and node["f"] in ("nan", "inf", "-inf"):
        return float(node["f"])
    if "b" in node:
        return base64.b64decode(node["b"], validate=True)
    if "c" in node:
        re, im = (_unpack(v, blobs) for v in node["c"])
        return complex(re, im)
    if "t" in node:
        return tuple(_unpack(v, blobs) for v in node["t"])
    if "d" in node:
        return {_unpack(k, blobs): _unpack(v, blobs) for k, v in node["d"]}
    if "x" in node:
        dtype = _DTYPES.get(str(node.get("dtype")))
        if dtype is None:
            raise WireError(f"malformed message (dtype {node.get('dtype')!r})")
        shape = [int(s) for s in node["shape"]]
        data = blobs[int(node["x"])]
        if not data:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
    raise WireError("malformed message")


def decode(data: bytes) -> Any:
    """What :func:`encode` sent; a message of any other form is a :class:`WireError` (it is
    read as data only: nothing in it is executed)."""
    try:
        if data[:4] != _MAGIC:
            raise WireError("not a privdl message (a peer that is not privdl's?)")
        (size,) = struct.unpack("<Q", data[4:12])
        msg = json.loads(data[12 : 12 + size].decode())
        blobs, at = [], 12 + size
        for n in msg["n"]:
            blobs.append(bytes(data[at : at + int(n)]))
            at += int(n)
        if at != len(data):
            raise WireError("malformed message (length)")
        return _unpack(msg["v"], blobs)
    except WireError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed message: one line
        raise WireError(f"malformed message ({type(exc).__name__})") from None
