"""What the loop's collectives send (issue 38, item 1): plain data, never a pickle; a
key_source=os checkpoint (which holds the keys) is refused before anything is sent."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from privdl.comm import wire
from privdl.errors import PrivdlError
from privdl.loop import LocalWorld, config_from_dump, fit, train
from privdl.registry import make_config


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
            and bool(torch.equal(a, b))
        )  # fmt: skip
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_plain_data_and_tensors_round_trip_exactly():
    g = torch.Generator().manual_seed(0)
    obj = {
        "t": 200, 0: torch.randn(7, 3, generator=g, dtype=torch.float64), "x32": torch.randn(5),
        "bf": torch.randn(4, generator=g).to(torch.bfloat16), "ids": torch.arange(6).view(2, 3),
        "mask": torch.tensor([True, False]), "empty": torch.empty(0, 4, dtype=torch.int64),
        "keys": (b"\x00" * 32, None, bytes(range(32))), "nums": [1.5, -0.0, 2**70, True, None],
        "bad": [float("nan"), float("inf"), -float("inf")], "text": "é\n", "z": 1 + 2j,
        ("a", 1): {"nested": [(), []]},
    }  # fmt: skip
    assert _same(wire.decode(wire.encode(obj)), obj)
    # numpy values of older checkpoints: as privdl.records.plain_data makes them
    back = wire.decode(wire.encode({"a": np.arange(3), "s": np.float32(0.1)}))
    assert torch.equal(back["a"], torch.arange(3)) and back["s"] == float(np.float32(0.1))


def test_nothing_that_names_code_goes_on_or_comes_off_the_wire(tmp_path):
    class Payload:
        def __reduce__(self):
            return (open, (str(tmp_path / "ran"), "w"))

    with pytest.raises(TypeError, match="plain data"):
        wire.encode({"x": Payload()})
    for bad in (pickle.dumps(Payload()), pickle.dumps({"t": 1}), b"", b"PDW1" + b"\xff" * 20):
        with pytest.raises(wire.WireError):
            wire.decode(bad)
    good = wire.encode({"a": torch.ones(2)})
    with pytest.raises(wire.WireError):
        wire.decode(good + b"x")  # a length that does not add up
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    "values",
    [
        {"algorithm": "decor", "graph": "ring:6", "sigma": 0.5, "sigma_cor": 1.0, "clip": 1.0},
        {"algorithm": "privsgp-vr", "graph": "expo:8"},
        {"algorithm": "porter-dp", "graph": "ring:8", "sigma": 0.5, "clip": 1.0},
        {"algorithm": "robust-hdp", "epsilon": 3.0, "clip": 3.0},
    ],
)
def test_a_configuration_sent_as_plain_data_is_the_same_configuration(values):
    cfg = make_config(values)
    back = config_from_dump(wire.decode(wire.encode(cfg.model_dump())))
    assert type(back) is type(cfg) and back == cfg and back.model_dump() == cfg.model_dump()


class _TwoRanks(LocalWorld):
    """Rank 0 of two, with the broadcasts it is given captured (the wire)."""

    size = 2

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def broadcast(self, obj):
        self.sent.append(wire.encode(obj))
        return obj

    def all_gather(self, obj):
        self.sent.append(wire.encode(obj))
        return [obj, obj]


def test_a_checkpoint_holding_keys_is_refused_before_anything_is_sent(tmp_path):
    """privdl launch --resume of a privdl run --key-source os run: its checkpoint holds every
    key; rank 0 refuses before it sends the checkpoint (no key byte on the wire)."""
    from privdl.records import RunRecords

    cfg = make_config({"algorithm": "decor", "task": "least-squares", "graph": "ring:6",
                       "sigma": 0.5, "sigma_cor": 1.0, "clip": 1.0, "steps": 20,
                       "eval_every": 5, "key_source": "os"})  # fmt: skip
    assert train(cfg, tmp_path / "r", progress=False, stop_after=10) == {"stopped_at": 10}
    keys = RunRecords(tmp_path / "r").load_checkpoint()["keys"]
    secrets = [k for field in ("edge_keys", "noise_keys") for k in keys[field] if k]
    assert len(secrets) == 12  # 6 nodes' noise keys and DECOR's 6 edge secrets
    world = _TwoRanks()
    with pytest.raises(PrivdlError, match="keeps its keys in its checkpoint"):
        fit(None, tmp_path / "r", resume=True, world=world, progress=False)
    assert world.sent  # the refusal itself goes to the other ranks
    wire_bytes = b"".join(world.sent)
    assert not any(s in wire_bytes for s in secrets)
    assert not any(s.hex().encode() in wire_bytes for s in secrets)
