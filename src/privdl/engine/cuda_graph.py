"""Clipped node gradients replayed from a CUDA graph: the same kernels, one launch from the host.

On a GPU the private step of a small model (DECOR's MNIST MLP, 16 nodes, batch 64) is host-bound:
the kernels of :func:`privdl.engine.node_gradients` (forward, per-sample norms, clip factors,
the clipped sum; DECOR Algorithm 1 line 2) take a fraction of the time Python and the launches
take. :class:`GraphedGradients` captures that call once per input signature (the shapes and
dtypes of the parameters and the batch, the clipping) into a ``torch.cuda.CUDAGraph`` and then,
per call, copies the inputs into the graph's static buffers and replays it: the values are those
of the eager call (the same kernels on the same inputs), the host cost is a few launches.

Off CUDA, or where a capture fails (an operation that synchronizes with the host, say), the call
is the eager :func:`node_gradients`; :attr:`GraphedGradients.failure` says why it fell back.

The returned gradients live in the graph's output buffers: they are valid until the next call
with the same signature (the DECOR, D-SGD and LDP steps consume them at once). The loss and
per-sample norms are returned as copies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from privdl.engine.grads import ClipSpec, GradResult, node_gradients

__all__ = ["GraphedGradients", "graphed_oracle"]

#: at most this many signatures are captured (Poisson batches padded to few shapes stay under it);
#: further signatures run eagerly
MAX_GRAPHS = 8


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    params: list[Tensor]
    x: Tensor
    y: Tensor
    mask: Tensor | None
    out: GradResult


class GraphedGradients:
    """``node_gradients(model, params, x, y, loss=..., clip=..., ...)`` replayed from CUDA graphs.

    Keyword arguments are fixed per instance (they select the kernels); ``__call__(params, x, y,
    mask=None)`` takes what changes from step to step. ``warmup`` eager calls on a side stream
    precede each capture, as ``torch.cuda.graph`` requires.
    """

    def __init__(
        self,
        model: object,
        *,
        loss: str,
        clip: ClipSpec = ClipSpec(),
        reduction: Literal["mean", "sum"] = "mean",
        denominator: float | None = None,
        method: Literal["auto", "ghost", "vmap"] = "auto",
        warmup: int = 2,
    ) -> None:
        self.model = model
        self._kwargs = dict(
            loss=loss, clip=clip, reduction=reduction, denominator=denominator, method=method
        )
        self.warmup = int(warmup)
        self._graphs: dict[tuple, _Captured] = {}
        self._pool: Any = None
        #: why the last capture fell back to the eager call (None: no fallback)
        self.failure: str | None = None
        self.replays = 0

    def _eager(self, params: dict[str, Tensor], x: Tensor, y: Tensor, mask: Tensor | None):
        return node_gradients(self.model, params, x, y, mask=mask, **self._kwargs)  # type: ignore[arg-type]

    def __call__(
        self, params: dict[str, Tensor], x: Tensor, y: Tensor, *, mask: Tensor | None = None
    ) -> GradResult:
        if x.device.type != "cuda" or not torch.cuda.is_available():
            return self._eager(params, x, y, mask)
        key = (
            tuple((k, tuple(v.shape), v.dtype) for k, v in params.items()),
            tuple(x.shape), x.dtype, tuple(y.shape), y.dtype,
            None if mask is None else (tuple(mask.shape), mask.dtype),
            x.device,
        )  # fmt: skip
        cap = self._graphs.get(key)
        if cap is None:
            if len(self._graphs) >= MAX_GRAPHS or self.failure is not None:
                return self._eager(params, x, y, mask)
            try:
                cap = self._capture(params, x, y, mask)
            except Exception as exc:  # noqa: BLE001 - any capture error means: run eagerly
                self.failure = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                torch.cuda.synchronize(x.device)
                return self._eager(params, x, y, mask)
            self._graphs[key] = cap
        torch._foreach_copy_(cap.params, list(params.values()))
        cap.x.copy_(x, non_blocking=True)
        cap.y.copy_(y, non_blocking=True)
        if cap.mask is not None and mask is not None:
            cap.mask.copy_(mask, non_blocking=True)
        cap.graph.replay()
        self.replays += 1
        out = cap.out
        norms = out.per_sample_norms
        return GradResult(
            grads=dict(out.grads),
            loss=out.loss.clone(),
            per_sample_norms=None if norms is None else norms.clone(),
        )

    def _capture(
        self, params: dict[str, Tensor], x: Tensor, y: Tensor, mask: Tensor | None
    ) -> _Captured:
        names = list(params)
        s_params = [v.detach().clone() for v in params.values()]
        s_x, s_y = x.detach().clone(), y.detach().clone()
        s_mask = None if mask is None else mask.detach().clone()

        def call() -> GradResult:
            return self._eager(dict(zip(names, s_params, strict=True)), s_x, s_y, s_mask)

        side = torch.cuda.Stream(device=x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):
            for _ in range(max(self.warmup, 1)):
                call()
        torch.cuda.current_stream(x.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            out = call()
        return _Captured(graph, s_params, s_x, s_y, s_mask, out)


def graphed_oracle(
    model: object,
    x: Tensor,
    y: Tensor,
    *,
    loss: str,
) -> Callable[..., GradResult]:
    """A DECOR/D-SGD gradient oracle on a fixed batch ``(x, y)`` whose clipped gradients replay
    from CUDA graphs (one :class:`GraphedGradients` per clipping; benchmarks and fixed-batch
    runs)."""
    per_clip: dict[ClipSpec, GraphedGradients] = {}

    def oracle(params: dict[str, Tensor], t: int, *, clip: ClipSpec) -> GradResult:
        g = per_clip.get(clip)
        if g is None:
            g = per_clip[clip] = GraphedGradients(model, loss=loss, clip=clip)
        return g(params, x, y)

    oracle.graphs = per_clip  # type: ignore[attr-defined]
    return oracle
