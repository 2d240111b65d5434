"""Stacked ResNets for CIFAR (Robust-HDP App. B.1, Table 6 "Models").

* ``resnet18-gn``: torchvision layout (7x7 stride-2 stem, 3x3 stride-2 max-pool, BasicBlocks
  [2, 2, 2, 2], global average pool, fc 512 -> classes) with GroupNorm(2 groups) in place of
  BatchNorm; Kaiming-normal(fan_out) conv init, GN weight 1 / bias 0. p = 11,181,642 for 10 classes.
* ``resnet34-nonorm``: BasicBlocks [3, 4, 6, 3], no normalisation layers and no average pooling
  (the final map is flattened), as the Robust-HDP code's "CIFAR100" model. p = 21,272,778.

All nodes run in one set of kernels: activations are kept as ``(B, n*C, H, W)``, so a stacked
convolution is one grouped convolution and a stacked GroupNorm is one ``group_norm`` with
``n * groups`` groups (GroupNorm's groups are contiguous channel blocks).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from privdl.models.base import (
    Activation,
    AvgPool2d,
    Conv2d,
    Flatten,
    GroupNorm,
    Layer,
    LayerApply,
    Linear,
    MaxPool2d,
    ParamShapes,
    StackedModel,
)


class StackedResNet(StackedModel):
    """ResNet with BasicBlocks; ``norm_groups=None`` removes every normalisation layer."""

    def __init__(
        self,
        name: str,
        *,
        in_shape: tuple[int, ...],
        n_classes: int,
        blocks: tuple[int, ...] = (2, 2, 2, 2),
        width: int = 64,
        norm_groups: int | None = 2,
        avgpool: bool = True,
    ) -> None:
        self.name = name
        self.in_shape = tuple(in_shape)
        self.n_classes = n_classes
        self.blocks, self.width, self.norm_groups, self.avgpool = (
            blocks,
            width,
            norm_groups,
            avgpool,
        )
        self.out_shape = (n_classes,)
        c, h, w = self.in_shape
        self._convs: dict[str, tuple[int, int, int, int, int]] = {}  # name -> (out,in,k,stride,pad)
        self._norms: dict[str, int] = {}
        self._plan: list[tuple[str, int, bool]] = []  # (block prefix, stride, has downsample)
        #: privdl's layer for every parameterised name and the stateless steps: the same
        #: network as ``forward``, run layer by layer by ``forward_with`` (the ghost path)
        self._layers: dict[str, Layer] = {
            "relu": Activation("relu"),
            "maxpool": MaxPool2d(3, stride=2, padding=1),
            "avgpool": AvgPool2d(None),
            "flatten": Flatten(),
        }
        self._add_conv("conv1", width, c, 7, 2, 3)
        self._add_norm("bn1", width)
        h, w = (h + 6 - 7) // 2 + 1, (w + 6 - 7) // 2 + 1
        h, w = (h + 2 - 3) // 2 + 1, (w + 2 - 3) // 2 + 1
        inplanes = width
        for stage, nblocks in enumerate(blocks):
            planes = width * 2**stage
            for j in range(nblocks):
                stride = 2 if (stage > 0 and j == 0) else 1
                prefix = f"layer{stage + 1}.{j}"
                self._add_conv(f"{prefix}.conv1", planes, inplanes, 3, stride, 1)
                self._add_norm(f"{prefix}.bn1", planes)
                self._add_conv(f"{prefix}.conv2", planes, planes, 3, 1, 1)
                self._add_norm(f"{prefix}.bn2", planes)
                down = stride != 1 or inplanes != planes
                if down:
                    self._add_conv(f"{prefix}.downsample.0", planes, inplanes, 1, stride, 0)
                    self._add_norm(f"{prefix}.downsample.1", planes)
                self._plan.append((prefix, stride, down))
                inplanes = planes
                h, w = (h + 2 - 3) // stride + 1, (w + 2 - 3) // stride + 1
        self.features = inplanes if avgpool else inplanes * h * w
        self._layers["fc"] = Linear(self.features, n_classes)
        self._layer_inputs: list[tuple[str, Layer, tuple[int, ...]]] | None = None

    def _add_conv(self, name, out, inp, k, stride, pad):
        self._convs[name] = (out, inp, k, stride, pad)
        self._layers[name] = Conv2d(inp, out, k, stride=stride, padding=pad, bias=False)

    def _add_norm(self, name, channels):
        if self.norm_groups is not None:
            self._norms[name] = channels
            self._layers[name] = GroupNorm(self.norm_groups, channels)

    def param_shapes(self) -> ParamShapes:
        shapes: ParamShapes = {}
        for name, (out, inp, k, _, _) in self._convs.items():
            shapes[f"{name}.weight"] = (out, inp, k, k)
            norm = name.replace("conv", "bn").replace("downsample.0", "downsample.1")
            if norm in self._norms:
                shapes[f"{norm}.weight"] = (self._norms[norm],)
                shapes[f"{norm}.bias"] = (self._norms[norm],)
        shapes["fc.weight"] = (self.n_classes, self.features)
        shapes["fc.bias"] = (self.n_classes,)
        return shapes

    def _init_one(
        self, generator: torch.Generator, dtype: torch.dtype, device: torch.device
    ) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for key, shape in self.param_shapes().items():
            if key.startswith("fc."):
                bound = 1.0 / math.sqrt(self.features)
                r = torch.rand(shape, generator=generator, dtype=dtype, device=device)
                out[key] = (2 * r - 1) * bound
            elif len(shape) == 4:  # Kaiming normal, fan_out, ReLU gain
                std = math.sqrt(2.0 / (shape[0] * shape[2] * shape[3]))
                out[key] = torch.randn(shape, generator=generator, dtype=dtype, device=device) * std
            elif key.endswith(".weight"):
                out[key] = torch.ones(shape, dtype=dtype, device=device)
            else:
                out[key] = torch.zeros(shape, dtype=dtype, device=device)
        return out

    # -- forward in (B, n*C, H, W) layout ---------------------------------------------------
    def _conv(self, p: dict[str, Tensor], name: str, x: Tensor, n: int) -> Tensor:
        _, _, _, stride, pad = self._convs[name]
        w = p[f"{name}.weight"]
        return F.conv2d(x, w.reshape(-1, *w.shape[2:]), stride=stride, padding=pad, groups=n)

    def _norm(self, p: dict[str, Tensor], name: str, x: Tensor, n: int) -> Tensor:
        if self.norm_groups is None:
            return x
        return F.group_norm(
            x, n * self.norm_groups, p[f"{name}.weight"].reshape(-1), p[f"{name}.bias"].reshape(-1)
        )

    def forward(self, params, x):
        n, b = x.shape[:2]
        h = x.transpose(0, 1).reshape(b, n * x.shape[2], *x.shape[3:])
        h = torch.relu(self._norm(params, "bn1", self._conv(params, "conv1", h, n), n))
        h = F.max_pool2d(h, 3, stride=2, padding=1)
        for prefix, _, down in self._plan:
            out = torch.relu(
                self._norm(params, f"{prefix}.bn1", self._conv(params, f"{prefix}.conv1", h, n), n)
            )
            out = self._norm(
                params, f"{prefix}.bn2", self._conv(params, f"{prefix}.conv2", out, n), n
            )
            if down:
                h = self._norm(
                    params,
                    f"{prefix}.downsample.1",
                    self._conv(params, f"{prefix}.downsample.0", h, n),
                    n,
                )
            h = torch.relu(out + h)
        if self.avgpool:
            h = h.mean(dim=(2, 3))
        feats = h.reshape(b, n, -1).transpose(0, 1)
        return torch.baddbmm(
            params["fc.bias"].unsqueeze(1), feats, params["fc.weight"].transpose(1, 2)
        )

    # -- forward layer by layer in (n, B, C, H, W) layout (the ghost path) ----------------------
    def forward_with(self, params: dict[str, Tensor], x: Tensor, apply: LayerApply) -> Tensor:
        """``forward`` with every layer run as ``apply(name, layer, its params, input)``; the
        residual sums are plain tensor sums between layers. Same values as ``forward`` (its
        one-grouped-convolution layout) up to rounding (tested)."""

        def run(name: str, a: Tensor) -> Tensor:
            layer = self._layers[name]
            return apply(name, layer, {k: params[f"{name}.{k}"] for k in layer.param_shapes()}, a)

        def norm(name: str, a: Tensor) -> Tensor:
            return run(name, a) if name in self._norms else a

        h = run("relu", norm("bn1", run("conv1", x)))
        h = run("maxpool", h)
        for prefix, _, down in self._plan:
            out = run("relu", norm(f"{prefix}.bn1", run(f"{prefix}.conv1", h)))
            out = norm(f"{prefix}.bn2", run(f"{prefix}.conv2", out))
            if down:
                h = norm(f"{prefix}.downsample.1", run(f"{prefix}.downsample.0", h))
            h = run("relu", out + h)
        if self.avgpool:
            h = run("avgpool", h)
        return run("fc", run("flatten", h))

    def layer_inputs(self) -> list[tuple[str, Layer, tuple[int, ...]]]:
        """Every layer ``forward_with`` runs, with the per-sample shape of its input, in order
        (found once by running it on shape-only "meta" tensors: ~0.1 s, and ``method="auto"``
        asks at every gradient call)."""
        if self._layer_inputs is None:
            self._layer_inputs = self._trace_layer_inputs()
        return list(self._layer_inputs)

    def _trace_layer_inputs(self) -> list[tuple[str, Layer, tuple[int, ...]]]:
        steps: list[tuple[str, Layer, tuple[int, ...]]] = []

        def record(name: str, layer: Layer, lp: dict[str, Tensor], a: Tensor) -> Tensor:
            steps.append((name, layer, tuple(a.shape[2:])))
            return layer.forward(lp, a)

        meta = {k: torch.empty((1, *s), device="meta") for k, s in self.param_shapes().items()}
        self.forward_with(meta, torch.empty((1, 1, *self.in_shape), device="meta"), record)
        return steps
