"""Models whose parameters are stacked over nodes.

Every parameter tensor carries a leading dimension ``n`` (the nodes this process owns), so one
batched kernel serves all nodes (DESIGN.md, "Node state"). Models are pure functions of a parameter
dict: ``forward(params, x)`` with ``x`` of shape ``(n, B, *in_shape)``.

:class:`SequentialModel` is a chain of :class:`Layer` objects. The per-sample-gradient engine
recognises its :class:`Linear` and :class:`Conv2d` layers and computes per-sample gradient norms
from their activations and output gradients ("ghost clipping"), without materialising every
per-sample gradient.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from privdl.errors import ConfigError

ParamShapes = dict[str, tuple[int, ...]]
InitFn = Callable[[torch.Generator, torch.dtype, torch.device], dict[str, Tensor]]
#: ``apply(name, layer, layer_params, input) -> output``: how a model runs one of its layers.
LayerApply = Callable[[str, "Layer", dict[str, Tensor], Tensor], Tensor]


class StackedModel(ABC):
    """A model whose parameters have a leading node dimension ``n``."""

    name: str = "model"
    in_shape: tuple[int, ...] = ()
    out_shape: tuple[int, ...] = ()
    #: the input is integer indices (an embedding reads it), not float features
    takes_indices: bool = False
    #: the number of rows of that embedding (valid indices ``0 .. V - 1``), where known
    input_vocabulary: int | None = None

    @abstractmethod
    def param_shapes(self) -> ParamShapes:
        """Per-node parameter shapes, in the order of ``torch.nn.Module.parameters()``."""

    @abstractmethod
    def _init_one(
        self, generator: torch.Generator, dtype: torch.dtype, device: torch.device
    ) -> dict[str, Tensor]:
        """One node's freshly initialised parameters (no node dimension)."""

    @abstractmethod
    def forward(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        """``x`` of shape ``(n, B, *in_shape)`` to outputs ``(n, B, *out_shape)``."""

    def num_parameters(self) -> int:
        """Number of parameters of one node (the model dimension ``d`` / ``p`` of the papers)."""
        return sum(math.prod(s) for s in self.param_shapes().values())

    def init(
        self,
        *,
        n_nodes: int,
        generator: torch.Generator,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        same_init: bool = True,
    ) -> dict[str, Tensor]:
        """Stacked initial parameters, each of shape ``(n_nodes, *shape)``.

        ``same_init=True`` gives every node the same draw (all papers start every node from the
        same ``x^0``); otherwise node ``i`` gets the ``i``-th consecutive draw from ``generator``.
        """
        if n_nodes < 1:
            raise ConfigError(f"n_nodes must be >= 1, got {n_nodes}")
        if dtype not in (torch.float32, torch.float64):
            raise ConfigError(f"dtype must be float32 or float64, got {dtype}")
        device = torch.device(device)
        gen_device = generator.device
        draws = 1 if same_init else n_nodes
        per_node = [self._init_one(generator, dtype, gen_device) for _ in range(draws)]
        out: dict[str, Tensor] = {}
        for key in self.param_shapes():
            if same_init:
                stacked = per_node[0][key].unsqueeze(0).expand(n_nodes, *per_node[0][key].shape)
            else:
                stacked = torch.stack([p[key] for p in per_node])
            out[key] = stacked.to(device).contiguous()
        return out


# --------------------------------------------------------------------------------------------
# Layers


class Layer:
    """A stacked layer: ``forward(params, a)`` with ``a`` of shape ``(n, B, ...)``."""

    #: the layer reads integer indices (an embedding), not float features
    reads_indices: bool = False

    def param_shapes(self) -> ParamShapes:
        return {}

    def init(
        self, generator: torch.Generator, dtype: torch.dtype, device: torch.device
    ) -> dict[str, Tensor]:
        return {}

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        return in_shape

    def forward(self, params: dict[str, Tensor], a: Tensor) -> Tensor:
        raise NotImplementedError

    def param_key(self, name: str, key: str) -> str:
        """The model-wide name of parameter ``key`` of the layer called ``name``."""
        return f"{name}.{key}"


def uniform_init(shape: Sequence[int], bound: float, gen, dtype, device) -> Tensor:
    return (torch.rand(tuple(shape), generator=gen, dtype=dtype, device=device) * 2 - 1) * bound


class Linear(Layer):
    """``z = a W^T + b`` with ``W`` of shape ``(n, out, in)``; torch's default init
    (uniform on ``+-1/sqrt(in)`` for weight and bias)."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True) -> None:
        self.in_features, self.out_features, self.bias = in_features, out_features, bias

    def param_shapes(self) -> ParamShapes:
        shapes: ParamShapes = {"weight": (self.out_features, self.in_features)}
        if self.bias:
            shapes["bias"] = (self.out_features,)
        return shapes

    def init(self, generator, dtype, device):
        bound = 1.0 / math.sqrt(self.in_features)
        return {
            k: uniform_init(s, bound, generator, dtype, device)
            for k, s in self.param_shapes().items()
        }

    def out_shape(self, in_shape):
        if not in_shape or in_shape[-1] != self.in_features:
            raise ConfigError(
                f"Linear({self.in_features}, {self.out_features}) on samples of shape "
                f"{tuple(in_shape)}: their last dimension must have {self.in_features} features"
            )
        return (*in_shape[:-1], self.out_features)

    def forward(self, params, a):
        """``a (n, B, in)`` or ``(n, B, *positions, in)`` (the same map at every position, as
        ``torch.nn.Linear`` on its last dimension)."""
        w = params["weight"].transpose(1, 2)
        flat = a if a.dim() == 3 else a.reshape(a.shape[0], -1, a.shape[-1])
        if "bias" in params:
            z = torch.baddbmm(params["bias"].unsqueeze(1), flat, w)
        else:
            z = torch.bmm(flat, w)
        return z if a.dim() == 3 else z.reshape(*a.shape[:-1], z.shape[-1])


class Convolution(Layer):
    """What the convolutions share: ``in_channels`` to ``out_channels`` with a square kernel over
    ``spatial_dims`` dimensions, weight ``(n, out, in, k, ...)`` and optional bias; torch's
    default init (uniform on ``+-1/sqrt(in k^spatial_dims)``)."""

    spatial_dims = 2

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int = 1,
        padding: int = 0,
        bias: bool = True,
    ) -> None:
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding, self.bias = kernel_size, stride, padding, bias

    def param_shapes(self) -> ParamShapes:
        kernel = (self.kernel_size,) * self.spatial_dims
        shapes: ParamShapes = {"weight": (self.out_channels, self.in_channels, *kernel)}
        if self.bias:
            shapes["bias"] = (self.out_channels,)
        return shapes

    def init(self, generator, dtype, device):
        bound = 1.0 / math.sqrt(self.in_channels * self.kernel_size**self.spatial_dims)
        return {
            k: uniform_init(s, bound, generator, dtype, device)
            for k, s in self.param_shapes().items()
        }


class Conv2d(Convolution):
    """Square-kernel 2-D convolution over stacked nodes, as one grouped convolution.

    Weight ``(n, out, in, k, k)``; torch's default init (uniform on ``+-1/sqrt(in k^2)``).
    """

    def out_shape(self, in_shape):
        _, h, w = in_shape
        k, s, p = self.kernel_size, self.stride, self.padding
        return (self.out_channels, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1)

    def forward(self, params, a):
        z = stacked_conv2d(
            a, params["weight"], params.get("bias"), stride=self.stride, padding=self.padding
        )
        return z


def stacked_conv2d(
    a: Tensor, weight: Tensor, bias: Tensor | None, *, stride: int, padding: int
) -> Tensor:
    """Convolution of ``a (n, B, C, H, W)`` with per-node ``weight (n, O, C, k, k)``, one launch."""
    n, b = a.shape[:2]
    x = a.transpose(0, 1).reshape(b, n * a.shape[2], *a.shape[3:])
    w = weight.reshape(n * weight.shape[1], *weight.shape[2:])
    bb = None if bias is None else bias.reshape(-1)
    z = F.conv2d(x, w, bb, stride=stride, padding=padding, groups=n)
    return z.reshape(b, n, weight.shape[1], *z.shape[2:]).transpose(0, 1)


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "gelu": F.gelu,  # the exact (erf) form, nn.GELU()'s default
}


class Activation(Layer):
    """Elementwise activation (relu, sigmoid, tanh, gelu)."""

    def __init__(self, name: str) -> None:
        if name not in ACTIVATIONS:
            raise ConfigError(f"unknown activation {name!r}; choose from {sorted(ACTIVATIONS)}")
        self.name = name
        self.fn = ACTIVATIONS[name]

    def forward(self, params, a):
        return self.fn(a)


class MaxPool2d(Layer):
    """``kernel_size`` x ``kernel_size`` max pooling, stride ``kernel_size`` unless given, zero
    ``padding`` unless given (padded positions never win: ``F.max_pool2d`` pads with -inf)."""

    def __init__(self, kernel_size: int, *, stride: int | None = None, padding: int = 0) -> None:
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding = padding

    def out_shape(self, in_shape):
        c, h, w = in_shape
        k, s, p = self.kernel_size, self.stride, self.padding
        return (c, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1)

    def _pool(self, a: Tensor) -> Tensor:
        return F.max_pool2d(a, self.kernel_size, self.stride, self.padding)

    def forward(self, params, a):
        n, b = a.shape[:2]
        sample_major = a.transpose(0, 1)
        if sample_major.is_contiguous():  # a conv's output: pool without a layout copy
            z = self._pool(sample_major.reshape(b * n, *a.shape[2:]))
            return z.reshape(b, n, *z.shape[1:]).transpose(0, 1)
        z = self._pool(a.reshape(n * b, *a.shape[2:]))
        return z.reshape(n, b, *z.shape[1:])


class AvgPool2d(Layer):
    """``kernel_size`` x ``kernel_size`` average pooling with stride ``kernel_size``;
    ``kernel_size=None`` averages the whole map (``AdaptiveAvgPool2d(1)``: ``(C, 1, 1)``)."""

    def __init__(self, kernel_size: int | None) -> None:
        self.kernel_size = kernel_size

    def out_shape(self, in_shape):
        c, h, w = in_shape
        if self.kernel_size is None:
            return (c, 1, 1)
        return (c, h // self.kernel_size, w // self.kernel_size)

    def forward(self, params, a):
        if self.kernel_size is None:
            return a.mean(dim=(-2, -1), keepdim=True)
        n, b = a.shape[:2]
        z = F.avg_pool2d(a.reshape(n * b, *a.shape[2:]), self.kernel_size)
        return z.reshape(n, b, *z.shape[1:])


class GroupNorm(Layer):
    """Group normalisation of each sample (statistics over its own channel groups and positions,
    so per-sample clipping stays per sample), then the per-channel affine map ``x_hat * weight +
    bias`` (``torch.nn.GroupNorm``; weight 1 and bias 0 at init)."""

    def __init__(
        self, num_groups: int, num_channels: int, *, eps: float = 1e-5, affine: bool = True
    ) -> None:
        if num_channels % num_groups:
            raise ConfigError(f"GroupNorm: {num_channels} channels in {num_groups} groups")
        self.num_groups, self.num_channels, self.eps, self.affine = (
            num_groups,
            num_channels,
            eps,
            affine,
        )

    def param_shapes(self) -> ParamShapes:
        if not self.affine:
            return {}
        return {"weight": (self.num_channels,), "bias": (self.num_channels,)}

    def init(self, generator, dtype, device):
        if not self.affine:
            return {}
        c = self.num_channels
        return {
            "weight": torch.ones(c, dtype=dtype, device=device),
            "bias": torch.zeros(c, dtype=dtype, device=device),
        }

    def normalize(self, a: Tensor) -> Tensor:
        """``x_hat``: ``a (n, B, C, ...)`` normalised per sample and group, before the affine map."""
        n, b = a.shape[:2]
        flat = a.reshape(n * b, *a.shape[2:])
        return F.group_norm(flat, self.num_groups, eps=self.eps).reshape(a.shape)

    def affine_map(self, params: dict[str, Tensor], xhat: Tensor) -> Tensor:
        if not self.affine:
            return xhat
        shape = (xhat.shape[0], 1, self.num_channels) + (1,) * (xhat.dim() - 3)
        return torch.addcmul(params["bias"].reshape(shape), xhat, params["weight"].reshape(shape))

    def forward(self, params, a):
        return self.affine_map(params, self.normalize(a))


class Flatten(Layer):
    """Flatten each sample (C, H, W) to C*H*W, in torch's ``nn.Flatten`` order."""

    def out_shape(self, in_shape):
        return (math.prod(in_shape),)

    def forward(self, params, a):
        return a.reshape(*a.shape[:2], -1)


class SequentialModel(StackedModel):
    """A chain of stacked layers; parameter names are ``"<layer name>.<weight|bias>"``."""

    def __init__(
        self, name: str, in_shape: tuple[int, ...], layers: Sequence[tuple[str, Layer]]
    ) -> None:
        self.name = name
        self.in_shape = tuple(in_shape)
        self.layers = list(layers)
        shape = self.in_shape
        for _, layer in self.layers:
            shape = layer.out_shape(shape)
        self.out_shape = shape
        first = self.layers[0][1] if self.layers else None
        if first is not None and first.reads_indices:  # an embedding (privdl.models.sequence)
            self.takes_indices = True
            self.input_vocabulary = first.num_embeddings  # type: ignore[attr-defined]

    def param_shapes(self) -> ParamShapes:
        return {
            layer.param_key(lname, k): s
            for lname, layer in self.layers
            for k, s in layer.param_shapes().items()
        }

    def _init_one(
        self, generator: torch.Generator, dtype: torch.dtype, device: torch.device
    ) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for lname, layer in self.layers:
            for k, v in layer.init(generator, dtype, device).items():
                out[layer.param_key(lname, k)] = v
        return out

    def layer_params(
        self, params: dict[str, Tensor], lname: str, layer: Layer
    ) -> dict[str, Tensor]:
        return {k: params[layer.param_key(lname, k)] for k in layer.param_shapes()}

    def forward(self, params, x):
        return self.forward_with(params, x, lambda lname, layer, lp, a: layer.forward(lp, a))

    def forward_with(self, params: dict[str, Tensor], x: Tensor, apply: LayerApply) -> Tensor:
        """The forward pass with every layer run as ``apply(name, layer, its params, input)``
        (the ghost path records its parameterised layers this way)."""
        a = x
        for lname, layer in self.layers:
            a = apply(lname, layer, self.layer_params(params, lname, layer), a)
        return a

    def layer_inputs(self) -> list[tuple[str, Layer, tuple[int, ...]]]:
        """Every layer with the per-sample shape of its input, in run order."""
        out, shape = [], self.in_shape
        for lname, layer in self.layers:
            out.append((lname, layer, shape))
            shape = layer.out_shape(shape)
        return out
