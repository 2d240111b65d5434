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

``--net gn-cnn`` times an Opacus-style CNN on 1x28x28 inputs instead (Conv 16, GroupNorm(4),
ReLU, AvgPool 2, Conv 32, GroupNorm(8), ReLU, AdaptiveAvgPool 1, Linear 32-10): converted
(``method="auto"``, which on a CPU picks vmap where the conv patches outnumber the parameters,
and ``converted_ghost``, the ghost path with GroupNorm forced) against generic (privdl has no
built-in twin).

    python benchmarks/bench_module.py --iters 5 [--net gn-cnn] [--json-out out.json]
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
    ap.add_argument("--net", choices=("mlp", "gn-cnn", "resnet-gn"), default="mlp")
    add_run_flags(ap)
    args = ap.parse_args()
    tuned = apply_run_flags(args)
    if args.net != "mlp":
        module_vs_generic(args, tuned)
        return
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


def _gn_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(), nn.AvgPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )  # fmt: skip


class Block(nn.Module):
    """torchvision's BasicBlock with GroupNorm; a 1x1 strided downsample when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.gn1, self.relu = nn.GroupNorm(4, cout), nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.gn2 = nn.GroupNorm(4, cout)
        self.down = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.GroupNorm(4, cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.gn2(self.conv2(self.relu(self.gn1(self.conv1(x)))))
        out += self.down(x)
        return self.relu(out)


def _resnet_gn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.GroupNorm(4, 16), nn.ReLU(),
        Block(16, 16, 1), Block(16, 32, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(32, 10),
    )  # fmt: skip


def module_vs_generic(args: argparse.Namespace, tuned: dict) -> None:
    """``--net gn-cnn`` / ``--net resnet-gn``: converted against generic (vmap)."""
    torch.manual_seed(0)
    net, in_shape = (
        (_gn_cnn(), (1, 28, 28)) if args.net == "gn-cnn" else (_resnet_gn(), (3, 16, 16))
    )
    models = {
        "converted": from_module(net, in_shape=in_shape),
        "generic": ModuleModel(net, in_shape=in_shape),
    }
    gen = torch.Generator().manual_seed(0)
    params = models["generic"].init(n_nodes=N, generator=gen)
    x = torch.randn(N, BATCH, *in_shape, generator=gen)
    y = torch.randint(0, 10, (N, BATCH), generator=gen)
    clip = ClipSpec("per_sample", CLIP)

    models["converted_ghost"] = models["converted"]

    def step(name: str):
        method = "ghost" if name == "converted_ghost" else "auto"
        return lambda: node_gradients(
            models[name], params, x, y, loss="cross_entropy", clip=clip, method=method
        )

    ref = step("generic")().grads
    agree = {}
    for name in ("converted", "converted_ghost"):
        got = step(name)().grads
        agree[name] = max(float((got[k] - ref[k]).abs().max() / ref[k].abs().max()) for k in ref)
    names = list(models)
    times = interleaved_seconds([step(k) for k in names], iters=args.iters)
    med = {k: statistics.median(t) for k, t in zip(names, times, strict=True)}
    emit(
        {
            "setting": f"{args.net} ({'x'.join(map(str, in_shape))}, "
            f"p={models['generic'].num_parameters()}), "
            f"{N} nodes x batch {BATCH}, per-example clip {CLIP}",
            **machine_facts(tuned),
            "types": {k: type(m).__name__ for k, m in models.items()},
            **{f"{k}_s": v for k, v in med.items()},
            "max_rel_diff_to_generic": agree,
            "generic_over_converted": med["generic"] / med["converted"],
            "generic_over_converted_ghost": med["generic"] / med["converted_ghost"],
        },
        args.json_out,
    )


if __name__ == "__main__":
    main()
