"""Layers for sequences of tokens (text models), stacked over nodes as the layers of
:mod:`privdl.models.base`: an embedding that reads integer indices, per-sample reductions and
transposes, a 1-D convolution and layer normalisation. The per-sample-gradient engine clips each
without forming per-sample gradients (:mod:`privdl.engine.ghost`; docs/engine.md, "Text models").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from privdl.errors import ConfigError
from privdl.models.base import Convolution, Layer, ParamShapes

__all__ = ["AddParameter", "Conv1d", "Embedding", "Index", "LayerNorm", "Reduce", "Transpose"]


class Embedding(Layer):
    """Rows of a per-node table: ``z = W[t]`` for integer indices ``t (n, B, *idx)`` and ``W (n, V,
    D)``, one lookup for all nodes in the stacked ``(n V, D)`` table (``torch.nn.Embedding``
    without ``max_norm``; its init, N(0, 1), and its ``padding_idx``: that row starts at zero and
    gets no gradient)."""

    reads_indices = True

    def __init__(
        self, num_embeddings: int, embedding_dim: int, *, padding_idx: int | None = None
    ) -> None:
        if num_embeddings < 1 or embedding_dim < 1:
            raise ConfigError(f"Embedding({num_embeddings}, {embedding_dim}): sizes must be >= 1")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ConfigError(f"Embedding: padding_idx {padding_idx} outside the table")
            padding_idx %= num_embeddings  # torch's rule for a negative index
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = padding_idx

    def param_shapes(self) -> ParamShapes:
        return {"weight": (self.num_embeddings, self.embedding_dim)}

    def init(self, generator, dtype, device):
        shape = (self.num_embeddings, self.embedding_dim)
        weight = torch.randn(shape, generator=generator, dtype=dtype, device=device)
        if self.padding_idx is not None:
            weight[self.padding_idx] = 0.0
        return {"weight": weight}

    def out_shape(self, in_shape):
        return (*in_shape, self.embedding_dim)

    def rows(self, a: Tensor) -> Tensor:
        """Row ``i V + t`` of the stacked table for index ``t`` of node ``i`` (int64, ``a``'s
        shape); float indices are truncated (the data layer checks that they are integers)."""
        offset = torch.arange(a.shape[0], device=a.device) * self.num_embeddings
        return a.long() + offset.reshape(-1, *([1] * (a.dim() - 1)))

    def read(self, a: Tensor) -> Tensor | None:
        """``(n, B, *idx, 1)``: 1 where an index reads a row that learns, 0 at ``padding_idx``;
        ``None`` without one."""
        if self.padding_idx is None:
            return None
        return (a.long() != self.padding_idx).unsqueeze(-1)

    def forward(self, params, a):
        w = params["weight"]
        z = F.embedding(self.rows(a), w.reshape(-1, w.shape[-1]))
        read = self.read(a)
        return z if read is None else torch.where(read, z, z.detach())


class Reduce(Layer):
    """The mean, sum or maximum of each sample over one of its dimensions: ``x.mean(dim)``
    (``x.sum(dim)``, ``x.amax(dim)``) in a module's ``forward``, with ``dim`` counted as torch
    counts it on ``(B, ...)`` (``dim >= 1``, or negative from the end)."""

    def __init__(self, op: str, dim: int) -> None:
        if op not in ("mean", "sum", "amax") or dim == 0:
            raise ConfigError(f"Reduce: {op} over dim {dim} (the mean, sum or amax over dim != 0)")
        self.op, self.dim = op, dim

    def _axis(self, in_shape: tuple[int, ...]) -> int:
        """The reduced dimension among the per-sample ones."""
        axis = self.dim - 1 if self.dim > 0 else len(in_shape) + self.dim
        if not 0 <= axis < len(in_shape):
            raise ConfigError(f"Reduce: dim {self.dim} of a sample of shape {in_shape}")
        return axis

    def out_shape(self, in_shape):
        axis = self._axis(tuple(in_shape))
        return tuple(s for k, s in enumerate(in_shape) if k != axis)

    def forward(self, params, a):
        axis = 2 + self._axis(tuple(a.shape[2:]))
        return getattr(a, self.op)(dim=axis)


class Transpose(Layer):
    """``x.transpose(d0, d1)`` of each sample, with ``d0, d1`` counted as torch counts them on
    ``(B, ...)`` (``>= 1``, or negative from the end)."""

    def __init__(self, dim0: int, dim1: int) -> None:
        if 0 in (dim0, dim1):
            raise ConfigError("Transpose: the batch dimension stays where it is")
        self.dim0, self.dim1 = dim0, dim1

    def _axes(self, rank: int) -> tuple[int, int]:
        """The two swapped dimensions among a sample's ``rank`` ones."""
        axes = tuple(d - 1 if d > 0 else rank + d for d in (self.dim0, self.dim1))
        if not all(0 <= d < rank for d in axes):
            raise ConfigError(f"Transpose({self.dim0}, {self.dim1}) of samples of rank {rank}")
        return axes[0], axes[1]

    def out_shape(self, in_shape):
        i, j = self._axes(len(in_shape))
        shape = list(in_shape)
        shape[i], shape[j] = shape[j], shape[i]
        return tuple(shape)

    def forward(self, params, a):
        i, j = self._axes(a.dim() - 2)
        return a.transpose(2 + i, 2 + j)


class Conv1d(Convolution):
    """1-D convolution over stacked nodes, as one grouped convolution (``torch.nn.Conv1d`` with one
    group, no dilation, zero padding). Weight ``(n, out, in, k)``; torch's default init (uniform
    on ``+-1/sqrt(in k)``)."""

    spatial_dims = 1

    def out_shape(self, in_shape):
        if len(in_shape) != 2 or in_shape[0] != self.in_channels:
            raise ConfigError(f"Conv1d({self.in_channels}, ...) on samples of shape {in_shape}")
        k, s, p = self.kernel_size, self.stride, self.padding
        return (self.out_channels, (in_shape[1] + 2 * p - k) // s + 1)

    def forward(self, params, a):
        n, b = a.shape[:2]
        x = a.transpose(0, 1).reshape(b, n * a.shape[2], a.shape[3])
        w = params["weight"]
        bias = params.get("bias")
        z = F.conv1d(x, w.reshape(n * w.shape[1], *w.shape[2:]),
                     None if bias is None else bias.reshape(-1), stride=self.stride,
                     padding=self.padding, groups=n)  # fmt: skip
        return z.reshape(b, n, w.shape[1], z.shape[-1]).transpose(0, 1)

    def patches(self, a: Tensor) -> Tensor:
        """``U_s (C k, L')`` of every sample, ``(n B, C k, L')`` (``weight``'s ``(C, k)`` order)."""
        n, b, c, length = a.shape
        x = F.pad(a.reshape(n * b, c, length), (self.padding, self.padding))
        u = x.unfold(2, self.kernel_size, self.stride)  # (nB, C, L', k)
        return u.permute(0, 1, 3, 2).reshape(n * b, c * self.kernel_size, u.shape[2])


class LayerNorm(Layer):
    """Layer normalisation over each sample's last dimensions (``torch.nn.LayerNorm``: statistics
    over ``normalized_shape`` at every position, so per-sample clipping stays per sample), then
    the elementwise affine map ``x_hat * weight + bias`` (weight 1 and bias 0 at init)."""

    def __init__(
        self,
        normalized_shape: tuple[int, ...],
        *,
        eps: float = 1e-5,
        affine: bool = True,
        bias: bool = True,
    ) -> None:
        self.normalized_shape = tuple(int(d) for d in normalized_shape)
        self.eps, self.affine, self.bias = eps, affine, bias and affine

    def param_shapes(self) -> ParamShapes:
        shapes: ParamShapes = {}
        if self.affine:
            shapes["weight"] = self.normalized_shape
        if self.bias:
            shapes["bias"] = self.normalized_shape
        return shapes

    def init(self, generator, dtype, device):
        fill = {"weight": torch.ones, "bias": torch.zeros}
        return {k: fill[k](s, dtype=dtype, device=device) for k, s in self.param_shapes().items()}

    def out_shape(self, in_shape):
        k = len(self.normalized_shape)
        if tuple(in_shape[len(in_shape) - k :]) != self.normalized_shape or len(in_shape) < k:
            raise ConfigError(f"LayerNorm{self.normalized_shape} on samples of shape {in_shape}")
        return in_shape

    def normalize(self, a: Tensor) -> Tensor:
        """``x_hat``: ``a (n, B, ..., *normalized_shape)`` normalised, before the affine map."""
        return F.layer_norm(a, self.normalized_shape, eps=self.eps)

    def affine_map(self, params: dict[str, Tensor], xhat: Tensor) -> Tensor:
        if not self.affine:
            return xhat
        shape = (xhat.shape[0],) + (1,) * (xhat.dim() - 1 - len(self.normalized_shape))
        weight = params["weight"].reshape(*shape, *self.normalized_shape)
        if "bias" not in params:
            return xhat * weight
        return torch.addcmul(params["bias"].reshape(weight.shape), xhat, weight)

    def forward(self, params, a):
        return self.affine_map(params, self.normalize(a))


class AddParameter(Layer):
    """``a + P``: a parameter of the module added to every sample (a transformer's learned
    positional embedding, ``x + self.pos`` with ``pos`` of shape ``(T, D)`` or ``(1, T, D)``), or a
    constant tensor (a buffer: fixed sinusoidal positions) when ``value`` is given. ``P``
    broadcasts against one sample's shape, aligned from the right; a leading dimension where the
    batch is must have size 1. The parameter keeps the module's own name (``key``).

    A sample's gradient of ``P`` is its output gradient ``G_s`` summed over the dimensions ``P``
    broadcasts along (:meth:`per_sample`), so the ghost path clips it from ``G_s`` alone."""

    def __init__(self, key: str, shape: tuple[int, ...], *, value: Tensor | None = None) -> None:
        self.key, self.shape, self.value = key, tuple(int(d) for d in shape), value

    def param_shapes(self) -> ParamShapes:
        return {} if self.value is not None else {"weight": self.shape}

    def param_key(self, name: str, key: str) -> str:
        return self.key

    def _sample_shape(self, rank: int) -> tuple[int, ...]:
        """``P``'s shape against samples of ``rank`` dimensions (leading ones padded)."""
        extra = len(self.shape) - rank
        if extra > 0 and any(d != 1 for d in self.shape[:extra]):
            raise ConfigError(f"{self.key} of shape {self.shape} spans the batch dimension")
        return (1,) * max(-extra, 0) + self.shape[max(extra, 0) :]

    def out_shape(self, in_shape):
        p = self._sample_shape(len(in_shape))
        if any(q not in (1, s) for q, s in zip(p, in_shape, strict=True)):
            raise ConfigError(
                f"{self.key} of shape {self.shape} added to samples of shape {in_shape}"
            )
        return in_shape

    def forward(self, params, a):
        p = self._sample_shape(a.dim() - 2)
        if self.value is not None:
            return a + self.value.to(a.device, a.dtype).reshape(1, 1, *p)
        return a + params["weight"].reshape(a.shape[0], 1, *p)

    def per_sample(self, g: Tensor) -> Tensor:
        """``(n, B, *P.shape)``: each sample's gradient of ``P`` from ``g (n, B, *sample)``."""
        p = self._sample_shape(g.dim() - 2)
        broadcast = tuple(2 + i for i, (q, s) in enumerate(zip(p, g.shape[2:], strict=True))
                          if q == 1 and s != 1)  # fmt: skip
        summed = g.sum(broadcast, keepdim=True) if broadcast else g
        return summed.reshape(*g.shape[:2], *self.shape)


class Index(Layer):
    """``h[:, i]``: one position of every sample (a transformer's first, "CLS", token), or any
    index of a sample's dimensions by integers and full slices (``h[:, 0, :]``, ``h[:, :, -1]``)."""

    def __init__(self, index: tuple[int | slice, ...]) -> None:
        if not all(isinstance(i, int) or i == slice(None) for i in index):
            raise ConfigError(f"Index{index}: only integers and full slices")
        self.index = tuple(index)

    def out_shape(self, in_shape):
        try:
            return tuple(torch.empty(in_shape, device="meta")[self.index].shape)
        except IndexError as exc:
            raise ConfigError(f"Index{self.index} of samples of shape {in_shape}: {exc}") from None

    def forward(self, params, a):
        return a[(slice(None), slice(None), *self.index)]
