"""The oracle of the module tests: per-sample clipping by a loop over nodes and samples."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def clipped_mean_loop(module: nn.Module, params, x, y, threshold: float):
    """Per node and sample: the module with that node's weights, one backward, clip, mean."""
    out = {k: torch.zeros_like(v) for k, v in params.items()}
    for i in range(x.shape[0]):
        module.load_state_dict({k: v[i] for k, v in params.items()})
        named = dict(module.named_parameters())
        for s in range(x.shape[1]):
            g = torch.autograd.grad(F.cross_entropy(module(x[i, s : s + 1]), y[i, s : s + 1]),
                                    list(named.values()))  # fmt: skip
            c = min(1.0, threshold / float(torch.sqrt(sum((gg**2).sum() for gg in g))))
            for k, gg in zip(named, g, strict=True):
                out[k][i] += c * gg / x.shape[1]
    return out


def assert_cuda_matches_cpu(model, params, x, y, threshold: float) -> None:
    """The ghost path's clipped gradients on the CUDA device equal the CPU's (float64)."""
    from privdl.engine import ClipSpec, node_gradients

    clip = ClipSpec("per_sample", threshold)
    cpu = node_gradients(model, params, x, y, loss="cross_entropy", clip=clip, method="ghost")
    on = {k: v.cuda() for k, v in params.items()}
    gpu = node_gradients(model, on, x.cuda(), y.cuda(), loss="cross_entropy", clip=clip,
                         method="ghost")  # fmt: skip
    for k in cpu.grads:
        torch.testing.assert_close(gpu.grads[k].cpu(), cpu.grads[k], rtol=1e-9, atol=1e-12)


def marked_tokens(n: int, vocabulary: int, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences of 8 random tokens in ``2 .. vocabulary - 1`` whose class (0 or 1) is
    the token at ``position`` (seed 0)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(2, vocabulary, (n, 8), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    x[:, position] = y
    return x, y


def train_dpsgd(model: nn.Module, x, y, *, lr: float, out):
    """``privdl.train`` by DP-SGD at epsilon 8 (delta 1e-5), 150 steps of batch 32."""
    import privdl

    return privdl.train(algorithm="dpsgd", model=model, data=(x, y), clip=1.0, epsilon=8.0,
                        delta=1e-5, steps=150, eval_every=150, batch_size=32, lr=lr, out=out,
                        progress=False)  # fmt: skip
