"""A user's own ``nn.Module`` (``--model package.module:Name``): the converted fast path against
the generic one, on the DECOR MNIST setting (16 nodes, MLP 784-128-10, batch 64, per-example
clipping at C = 1).

Timed (median seconds per clipped gradient step, interleaved so load drift hits all alike):

* ``converted``: ``from_module(nn.Sequential(...))``, which becomes privdl's own layers and takes
  the ghost path (``privdl.models.module.SequentialModuleModel``);
* ``traced``: the same network written as a class whose ``forward`` calls ``F.relu``, converted
  through ``torch.fx``;
* ``generic``: ``ModuleModel`` of the same module, ``vmap(grad)`` per-sample gradients (what any
  other module gets);
* ``builtin``: ``build_model("mlp")``, privdl's own MLP (the reference: converted should match it).

The clipped gradients of all four agree (checked here, float32 rounding); the ratios
``generic_over_converted`` and ``converted_over_builtin`` are the figures.

    python benchmarks/bench_module.py --iters 5 [--json-out out.json]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from _common import add_run_flags, apply_run_flags, emit, interleaved_seconds, machine_facts
from torch import nn

from privdl.engine import ClipSpec, node_gradients
from privdl.models import ModuleModel, build_model, from_module

N, BATCH, CLIP = 16, 64, 1.0


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(784, 128), nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=5)
    add_run_flags(ap)
    args = ap.parse_args()
    tuned = apply_run_flags(args)
    seq = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    models = {
        "converted": from_module(seq, in_shape=(784,)),
        "traced": from_module(MLP(), in_shape=(784,)),
        "generic": ModuleModel(seq, in_shape=(784,)),
        "builtin": build_model("mlp", in_shape=(784,), n_classes=10),
    }
    gen = torch.Generator().manual_seed(0)
    base = models["builtin"].init(n_nodes=N, generator=gen)
    values = list(base.values())
    params = {k: dict(zip(m.param_shapes(), values, strict=True)) for k, m in models.items()}
    x = torch.randn(N, BATCH, 784, generator=gen)
    y = torch.randint(0, 10, (N, BATCH), generator=gen)
    clip = ClipSpec("per_sample", CLIP)

    def step(name: str):
        m, p = models[name], params[name]
        return lambda: node_gradients(m, p, x, y, loss="cross_entropy", clip=clip)

    ref = list(step("builtin")().grads.values())
    agree = {}
    for name in ("converted", "traced", "generic"):
        got = list(step(name)().grads.values())
        agree[name] = max(
            float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, ref, strict=True)
        )
    names = list(models)
    times = interleaved_seconds([step(k) for k in names], iters=args.iters)
    med = {k: statistics.median(t) for k, t in zip(names, times, strict=True)}
    res: dict[str, object] = {
        "setting": f"MLP 784-128-10, {N} nodes x batch {BATCH}, per-example clip {CLIP}",
        **machine_facts(tuned),
        "types": {k: type(m).__name__ for k, m in models.items()},
        **{f"{k}_s": v for k, v in med.items()},
        "max_rel_diff_to_builtin": agree,
        "generic_over_converted": med["generic"] / med["converted"],
        "traced_over_converted": med["traced"] / med["converted"],
        "converted_over_builtin": med["converted"] / med["builtin"],
    }
    emit(res, args.json_out)


if __name__ == "__main__":
    main()
