"""Bring your own ``torch.nn.Module``: a :class:`StackedModel` over any stateless module.

``ModuleModel(module, in_shape=...)`` runs ``module`` for every node at once: its parameters are
stacked over nodes and ``forward`` is ``torch.func.vmap`` over nodes of
``torch.func.functional_call(module, params_i, (x_i,))``. Per-sample gradients then come from the
engine's ``vmap(grad)`` path, so any module torch.func can differentiate works.

:func:`from_module` (what ``--model package.module:Name`` uses) first tries the fast path: an
``nn.Sequential`` (nested ones too) of ``Linear``, ``Conv2d`` (square kernel, one group, no
dilation, zero padding), ``GroupNorm``, ``InstanceNorm1d/2d``, ``LayerNorm``, ``ReLU``/``Sigmoid``/``Tanh``, ``MaxPool2d`` (any
stride and padding, square), ``AvgPool2d`` (stride = kernel), ``AdaptiveAvgPool2d(1)``, ``Flatten`` and ``Identity``, or a
``forward`` that ``torch.fx`` traces to a plain chain of them and of ``relu``/``sigmoid``/
``tanh``/``max_pool2d(x, k)``/``avg_pool2d(x, k)``/``adaptive_avg_pool2d(x, 1)``/
``flatten(x, 1)`` calls, with an ``nn.Embedding`` (``padding_idx`` too; no ``max_norm``) reading
integer inputs, ``Conv1d``, ``x.transpose(a, b)`` and ``x.mean(d)``/``x.sum(d)``/``x.amax(d)``
over a sample's dimensions, ``nn.GELU``, and self-attention (``nn.MultiheadAttention`` called as
``attn(h, h, h)[0]``, ``nn.TransformerEncoderLayer``, ``nn.TransformerEncoder``: ``batch_first``,
no dropout, unmasked or with the key padding mask ``x == pad`` of the input tokens;
:mod:`privdl.models.attention`), a parameter or buffer added once to the features
(``x + self.pos``: :class:`~privdl.models.sequence.AddParameter`), ``h[:, i]``, and
``nn.LSTM``/``nn.GRU``/``nn.RNN`` called as ``out, _ = rnn(x)`` (``batch_first``, either direction:
:mod:`privdl.models.recurrent`; other recurrent forms are refused, as ``vmap`` cannot run them),
becomes a
:class:`SequentialModuleModel` of privdl's own layers with the same parameter names, whose
per-sample norms come from the ghost path (for a 784-128-10 MLP on 16 nodes x 64 samples,
4.0 ms per clipped step against 1.17 s by ``vmap(grad)`` on 2 CPU threads: 296x,
``benchmarks/bench_module.py``, 2026-11-24).
Anything else takes the generic ``vmap`` path.

Initial weights: given a module, every node starts from its weights (the common ``x^0`` of the
papers; a pretrained module starts pretrained). Given a ``factory`` (a class or a function that
makes the module), each draw calls it under a torch seed taken from privdl's generator, so the
run's ``seed`` decides ``x^0`` and a resumed or distributed run rebuilds the same one.

Refused, with the reason: BatchNorm (its batch statistics mix the samples of a batch, so
per-sample clipping would not bound one sample's influence: use GroupNorm, as Opacus asks) and
Dropout with ``p > 0``, attention dropout included (a random forward pass that the vectorized per-sample gradients cannot redraw per
sample and node).

In a run config, ``model = "package.module:Name"`` names such a module: ``Name`` is an
``nn.Module`` instance, or a class or function that makes one when called with no arguments (a
factory, seeded as above). The import is made with the working directory on ``sys.path``, as
uvicorn and Flower do, so a ``mynet.py`` beside the run is found, and under a fixed torch seed,
so a module made at import time has the same weights in every process. The string is what the records save, so ``--resume`` and
``privdl launch`` rebuild the same module.
"""

from __future__ import annotations

import copy
import importlib
import operator
import os
import re
import sys
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap

from privdl.errors import ConfigError, DataError
from privdl.models.attention import InProjection, SelfAttention
from privdl.models.base import (
    ACTIVATIONS,
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
    SequentialModel,
    StackedModel,
)
from privdl.models.recurrent import Recurrent
from privdl.models.sequence import (
    AddParameter,
    Conv1d,
    Embedding,
    Index,
    LayerNorm,
    Reduce,
    Transpose,
)

#: ``package.module:attribute``; what tells a module spec from a built-in model name.
MODULE_SPEC = re.compile(r"^(?P<module>[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_][\w.]*)$")

_REFUSED: tuple[tuple[type[nn.Module], str], ...] = (
    (
        nn.modules.batchnorm._BatchNorm,
        "mixes the samples of a batch, so per-sample clipping would not bound one sample's "
        "influence; use GroupNorm",
    ),
    (
        nn.modules.dropout._DropoutNd,
        "draws a random mask the vectorized per-sample gradients cannot redraw per sample; "
        "remove it or set p=0",
    ),
)


def _is_identity_dropout(m: nn.Module) -> bool:
    """A dropout module with ``p = 0`` (the identity; ``nn.TransformerEncoderLayer(dropout=0)``
    holds three)."""
    return isinstance(m, nn.modules.dropout._DropoutNd) and m.p == 0


def _check_embedding(m: nn.Embedding | nn.EmbeddingBag, where: str) -> None:
    """``ConfigError`` for the embedding options per-sample clipping cannot honour."""
    if m.max_norm is not None:
        raise ConfigError(
            f"{type(m).__name__}{where}: max_norm rescales the table in place during the forward "
            "pass, which the vectorized per-sample gradients cannot do; remove it"
        )
    if m.scale_grad_by_freq:
        raise ConfigError(
            f"{type(m).__name__}{where}: scale_grad_by_freq scales by counts over the whole "
            "batch, so one sample's gradient would depend on the others; remove it"
        )


class ModuleModel(StackedModel):
    """A user's ``nn.Module`` with parameters stacked over nodes (see the module docstring)."""

    def __init__(
        self,
        module: nn.Module | None = None,
        *,
        in_shape: tuple[int, ...],
        name: str | None = None,
        factory: Callable[[], nn.Module] | None = None,
    ) -> None:
        if (module is None) == (factory is None):
            raise ConfigError("give ModuleModel exactly one of module= and factory=")
        self.factory = factory
        if factory is not None:
            module = _call_factory(factory, seed=0, name=name or repr(factory))
        if not isinstance(module, nn.Module):
            raise ConfigError(f"expected a torch.nn.Module, got {type(module).__name__}")
        for sub_name, sub in module.named_modules():
            where = f" ({sub_name})" if sub_name else ""
            for kind, why in _REFUSED:
                if isinstance(sub, kind) and not _is_identity_dropout(sub):
                    raise ConfigError(f"{type(sub).__name__}{where} {why}")
            if isinstance(sub, (nn.Embedding, nn.EmbeddingBag)):
                _check_embedding(sub, where)
            if isinstance(sub, nn.RNNBase) and sub.dropout:
                raise ConfigError(
                    f"{type(sub).__name__}{where}: dropout={sub.dropout} between its layers draws "
                    "a random mask the vectorized per-sample gradients cannot redraw per sample; "
                    "set dropout=0"
                )
            if isinstance(sub, nn.MultiheadAttention) and sub.dropout:
                raise ConfigError(
                    f"MultiheadAttention{where}: dropout={sub.dropout} draws a random mask the "
                    "vectorized per-sample gradients cannot redraw per sample; set dropout=0"
                )
            if isinstance(sub, nn.modules.instancenorm._InstanceNorm) and sub.track_running_stats:
                raise ConfigError(
                    f"{type(sub).__name__}{where}: track_running_stats keeps running statistics "
                    "of the data that no noise protects, and the trained model would carry them; "
                    "set track_running_stats=False"
                )
        self.module = copy.deepcopy(module).requires_grad_(False)
        self.name = name or type(module).__name__
        self.in_shape = tuple(int(s) for s in in_shape)
        self._weights = {k: v.detach().clone() for k, v in module.named_parameters()}
        if not self._weights:
            raise ConfigError(f"module {self.name} has no parameters to train")
        ref = next(iter(self._weights.values()))
        embeddings = [m for m in module.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
        try:
            with torch.no_grad():
                out = self.module(torch.zeros(2, *self.in_shape, dtype=ref.dtype))
        except Exception as exc:  # noqa: BLE001 - any failure of the user's forward
            out = self._index_probe(embeddings) if embeddings else None
            if out is None:
                raise ConfigError(
                    f"module {self.name} failed on a batch of shape (B, {', '.join(map(str, self.in_shape))}): "
                    f"{type(exc).__name__}: {exc}"
                ) from None
        if not torch.is_tensor(out) or out.ndim < 1 or out.shape[0] != 2:
            raise ConfigError(f"module {self.name} must map (B, *in_shape) to (B, *out_shape)")
        self.out_shape = tuple(out.shape[1:])

    def _index_probe(self, embeddings: list[nn.Embedding | nn.EmbeddingBag]) -> Tensor | None:
        """The output on a batch of index zeros, for a module that reads its input with an
        embedding (then it :attr:`takes_indices`; the vocabulary is known when it has one
        embedding); ``None`` if that fails too."""
        try:
            with torch.no_grad():
                out = self.module(torch.zeros(2, *self.in_shape, dtype=torch.long))
        except Exception:  # noqa: BLE001 - the float probe's error is the one reported
            return None
        self.takes_indices = True
        if len(embeddings) == 1:
            self.input_vocabulary = int(embeddings[0].num_embeddings)
        return out

    def param_shapes(self) -> ParamShapes:
        return {k: tuple(v.shape) for k, v in self._weights.items()}

    def _init_one(self, generator, dtype, device) -> dict[str, Tensor]:
        """A factory's module made under a seed drawn from ``generator``; else the module's own
        weights (the same for every draw)."""
        weights = self._weights
        if self.factory is not None:
            seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
            made = _call_factory(self.factory, seed=seed, name=self.name)
            weights = {k: v.detach() for k, v in made.named_parameters()}
            if {k: tuple(v.shape) for k, v in weights.items()} != self.param_shapes():
                raise ConfigError(f"model {self.name}: its factory made differently shaped modules")
        return {k: v.to(device=device, dtype=dtype) for k, v in weights.items()}

    def forward(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        """``x (n, B, *in_shape)`` -> ``(n, B, *out_shape)``: one vmap over nodes."""
        buffers = dict(self.module.named_buffers())
        if buffers and next(iter(buffers.values())).device != x.device:
            self.module.to(x.device)
            buffers = dict(self.module.named_buffers())

        def one_node(p: dict[str, Tensor], xb: Tensor) -> Tensor:
            return functional_call(self.module, {**buffers, **p}, (xb,))

        try:
            return vmap(one_node)(params, x)
        except IndexError as exc:  # indices past a table whose size privdl could not check
            if not self.takes_indices:
                raise
            raise DataError(
                f"the input of {self.name}: an index outside an embedding's table ({exc})"
            ) from None


class SequentialModuleModel(SequentialModel):
    """A user's ``nn.Sequential`` as privdl's own layers (ghost clipping), started from the
    module's weights or its seeded factory, exactly as :class:`ModuleModel` would be."""

    def __init__(self, source: ModuleModel, layers: list[tuple[str, Layer]]) -> None:
        super().__init__(source.name, source.in_shape, layers)
        self.source = source
        if super().param_shapes() != source.param_shapes() or self.out_shape != source.out_shape:
            raise ConfigError(f"module {source.name}: its layers do not convert one to one")

    def param_shapes(self) -> ParamShapes:
        """The module's names and shapes in its ``parameters()`` order (which may differ from
        the order its layers run in)."""
        return self.source.param_shapes()

    def _init_one(self, generator, dtype, device) -> dict[str, Tensor]:
        return self.source._init_one(generator, dtype, device)


#: The ``nn`` modules that are ``Activation`` layers.
_MODULE_ACTIVATIONS = {nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh"}


def _pair(v, what: str) -> int:
    """A square size: an int, or a pair of equal ints; else ``ValueError``."""
    if isinstance(v, int):
        return v
    if isinstance(v, tuple) and len(v) == 2 and v[0] == v[1] and isinstance(v[0], int):
        return v[0]
    raise ValueError(what)


def _as_layer(m: nn.Module) -> Layer | None:
    """privdl's layer for one leaf module (``None`` for ``Identity``); ``ValueError`` if none."""
    if isinstance(m, nn.Identity) or _is_identity_dropout(m):
        return None
    if type(m) is nn.GELU:
        if m.approximate != "none":
            raise ValueError("gelu approximation")
        return Activation("gelu")
    if type(m) is nn.Linear:
        return Linear(m.in_features, m.out_features, bias=m.bias is not None)
    if type(m) is nn.Conv2d:
        if m.groups != 1 or _pair(m.dilation, "dilation") != 1 or m.padding_mode != "zeros":
            raise ValueError("conv")
        return Conv2d(
            m.in_channels,
            m.out_channels,
            _pair(m.kernel_size, "kernel"),
            stride=_pair(m.stride, "stride"),
            padding=_pair(m.padding, "padding"),
            bias=m.bias is not None,
        )
    if type(m) is nn.Conv1d:
        if m.groups != 1 or m.dilation != (1,) or m.padding_mode != "zeros":
            raise ValueError("conv1d")
        if not isinstance(m.padding, tuple):  # "same" / "valid"
            raise ValueError("conv1d padding")
        return Conv1d(m.in_channels, m.out_channels, m.kernel_size[0], stride=m.stride[0],
                      padding=m.padding[0], bias=m.bias is not None)  # fmt: skip
    if type(m) in _MODULE_ACTIVATIONS:
        return Activation(_MODULE_ACTIVATIONS[type(m)])
    if type(m) is nn.MaxPool2d:
        k = _pair(m.kernel_size, "pool")
        if _pair(m.dilation, "pool") != 1 or m.ceil_mode or m.return_indices:
            raise ValueError("pool")
        return MaxPool2d(k, stride=_pair(m.stride, "pool"), padding=_pair(m.padding, "pool"))
    if type(m) is nn.AvgPool2d:
        k = _pair(m.kernel_size, "pool")
        if _pair(m.stride, "pool") != k or _pair(m.padding, "pool") != 0:
            raise ValueError("pool")
        if m.ceil_mode or m.divisor_override is not None:
            raise ValueError("pool")
        return AvgPool2d(k)
    if type(m) is nn.AdaptiveAvgPool2d:
        if _pair(m.output_size, "adaptive pool") != 1:
            raise ValueError("adaptive pool")
        return AvgPool2d(None)
    if type(m) is nn.GroupNorm:
        return GroupNorm(m.num_groups, m.num_channels, eps=m.eps, affine=m.affine)
    if type(m) in (nn.InstanceNorm1d, nn.InstanceNorm2d):  # = GroupNorm with a group a channel
        norm = cast(nn.InstanceNorm2d, m)
        return GroupNorm(norm.num_features, norm.num_features, eps=norm.eps, affine=norm.affine)
    if type(m) is nn.LayerNorm:
        return LayerNorm(
            tuple(m.normalized_shape), eps=m.eps, affine=m.elementwise_affine,
            bias=m.bias is not None,
        )  # fmt: skip
    if type(m) is nn.Flatten and m.start_dim == 1 and m.end_dim == -1:
        return Flatten()
    if type(m) is nn.Embedding:  # max_norm, scale_grad_by_freq: refused by ModuleModel;
        # sparse: the same dense gradient either way
        return Embedding(m.num_embeddings, m.embedding_dim, padding_idx=m.padding_idx)
    raise ValueError(type(m).__name__)


def _sequential_layers(module: nn.Module, prefix: str = "") -> list[tuple[str, Layer]]:
    if type(module) is not nn.Sequential:
        raise ValueError("not sequential")
    layers: list[tuple[str, Layer]] = []
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if type(child) is nn.Sequential:
            layers.extend(_sequential_layers(child, prefix=f"{path}."))
        elif (layer := _as_layer(child)) is not None:
            layers.append((path, layer))
    return layers


#: What a traced ``forward`` may call for an activation: ``Activation``'s own functions, their
#: ``torch.nn.functional`` twin for relu, and the tensor methods of the same names.
_FX_ACTIVATIONS: dict[Any, str] = {
    **{fn: name for name, fn in ACTIVATIONS.items()},
    **{name: name for name in ACTIVATIONS},
    torch.nn.functional.relu: "relu",
}


def _plain_pool(k: Any, kwargs: dict[str, Any], *, avg: bool = False) -> bool:
    """``max_pool2d(x, k)`` (or ``avg_pool2d(x, k)``) with every other argument at its default
    (stride = k)."""
    plain: dict[str, Any] = (
        {"stride": None, "padding": 0, "ceil_mode": False, "count_include_pad": True,
         "divisor_override": None}
        if avg
        else {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False,
              "return_indices": False}
    )  # fmt: skip
    if not isinstance(k, int) or kwargs.get("stride") not in (None, k):
        return False
    return all(kwargs.get(key, v) == v for key, v in plain.items() if key != "stride")


#: A traced step: its name, privdl's layer (``None``: the sum of its inputs, a residual
#: connection) and the indices of its inputs among the earlier steps (``-1``: the model input).
TracedStep = tuple[str, "Layer | None", tuple[int, ...]]

_ADDS = (operator.add, operator.iadd, torch.add, "add", "add_")

#: The keyword arguments a traced call may pass to a converted attention module, at these values
#: only (no masks: a padding mask would need per-sample inputs beside the features).
_ATTENTION_KWARGS = {
    "attn_mask": None, "key_padding_mask": None, "is_causal": False, "src_mask": None,
    "src_key_padding_mask": None, "mask": None,
}  # fmt: skip
_TRANSFORMERS = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder)


class _Steps:
    """The traced steps under construction; :meth:`push` appends one and returns its index."""

    def __init__(self) -> None:
        self.steps: list[TracedStep] = []

    def push(self, name: str, layer: Layer | None, inputs: tuple[int, ...]) -> int:
        self.steps.append((name, layer, inputs))
        return len(self.steps) - 1

    def add(self, a: int, b: int) -> int:
        return self.push(f"add{len(self.steps)}", None, (a, b))

    def attention(self, name: str, m: nn.MultiheadAttention, a: int, pad: int | None = None) -> int:
        """Self-attention at step ``a``: input projection, attention of the heads, output
        projection (:mod:`privdl.models.attention`)."""
        if not m.batch_first or not m._qkv_same_embed_dim:
            raise ValueError("attention layout")  # (T, B, D) inputs or separate q/k/v weights
        if m.bias_k is not None or m.add_zero_attn or m.dropout:
            raise ValueError("attention options")
        d = m.embed_dim
        a = self.push(name, InProjection(d, bias=m.in_proj_bias is not None), (a,))
        attention = SelfAttention(d, m.num_heads, padding_idx=pad)
        a = self.push(
            f"{name}.attention{len(self.steps)}", attention, (a,) if pad is None else (a, -1)
        )
        out = cast(nn.Linear, m.out_proj)
        return self.push(f"{name}.out_proj", Linear(d, d, bias=out.bias is not None), (a,))

    def encoder_layer(
        self, name: str, m: nn.TransformerEncoderLayer, a: int, pad: int | None = None
    ) -> int:
        """``nn.TransformerEncoderLayer`` at step ``a``: attention and feed-forward blocks, each
        with its residual sum, layer norm after (post-norm) or before (``norm_first``)."""
        if any(d.p for d in (m.dropout, m.dropout1, m.dropout2)):
            raise ValueError("dropout")
        act = m.activation
        if isinstance(act, nn.Module):
            act_layer = _as_layer(act)
        elif act in _FX_ACTIVATIONS:
            act_layer = Activation(_FX_ACTIVATIONS[act])
        else:
            raise ValueError("activation")
        norm1, norm2 = _as_layer(m.norm1), _as_layer(m.norm2)
        lin1, lin2 = _as_layer(m.linear1), _as_layer(m.linear2)

        def feed_forward(h: int) -> int:
            h = self.push(f"{name}.linear1", lin1, (h,))
            h = self.push(f"{name}.activation{len(self.steps)}", act_layer, (h,))
            return self.push(f"{name}.linear2", lin2, (h,))

        if m.norm_first:
            x1 = self.add(a, self.attention(f"{name}.self_attn", m.self_attn, self.push(
                f"{name}.norm1", norm1, (a,)), pad))  # fmt: skip
            return self.add(x1, feed_forward(self.push(f"{name}.norm2", norm2, (x1,))))
        x1 = self.add(a, self.attention(f"{name}.self_attn", m.self_attn, a, pad))
        x1 = self.push(f"{name}.norm1", norm1, (x1,))
        return self.push(f"{name}.norm2", norm2, (self.add(x1, feed_forward(x1)),))

    def encoder(self, name: str, m: nn.TransformerEncoder, a: int, pad: int | None = None) -> int:
        """``nn.TransformerEncoder``: its layers in turn, then its final norm if it has one."""
        for i, layer in enumerate(m.layers):
            layer = cast(nn.TransformerEncoderLayer, layer)
            a = self.encoder_layer(f"{name}.layers.{i}", layer, a, pad)
        if m.norm is not None:
            a = self.push(f"{name}.norm", _as_layer(m.norm), (a,))
        return a

    def recurrent(self, name: str, m: nn.RNNBase, node: Any, index: dict[Any, int]) -> int:
        """``nn.LSTM``/``nn.GRU``/``nn.RNN`` on one input (zero initial state), ``batch_first``,
        no dropout between layers, no projection: a :class:`Recurrent` step."""
        if len(node.args) != 1 or node.kwargs:
            raise ValueError("recurrent inputs")  # an initial state
        if not m.batch_first or m.proj_size or m.dropout:
            raise ValueError("recurrent options")
        if m.mode not in ("LSTM", "GRU", "RNN_TANH", "RNN_RELU"):
            raise ValueError("recurrent mode")
        layer = Recurrent(
            cast(Any, m.mode), m.input_size, m.hidden_size, num_layers=m.num_layers, bias=m.bias,
            bidirectional=m.bidirectional,
        )  # fmt: skip
        return self.push(name, layer, (index[node.args[0]],))

    def transformer(
        self, name: str, m: nn.Module, node: Any, index: dict[Any, int], masks: dict[Any, int]
    ) -> int:
        """A call of ``nn.MultiheadAttention`` (as self-attention: query, key and value the
        same tensor), ``nn.TransformerEncoderLayer`` or ``nn.TransformerEncoder``, unmasked or
        with a key padding mask ``x == pad`` of the model's input tokens (``masks``)."""
        args, kwargs = node.args, dict(node.kwargs)
        pad = None
        for key in ("key_padding_mask", "src_key_padding_mask"):
            if kwargs.get(key) in masks:
                pad = masks[kwargs.pop(key)]
        for key, value in _ATTENTION_KWARGS.items():
            if kwargs.pop(key, value) is not value:
                raise ValueError(f"attention {key}")
        if isinstance(m, nn.MultiheadAttention):
            kwargs.pop("need_weights", None)
            kwargs.pop("average_attn_weights", None)
            if kwargs or len(args) != 3 or not args[0] is args[1] is args[2]:
                raise ValueError("attention inputs")  # cross-attention or other arguments
            return self.attention(name, m, index[args[0]], pad)
        if kwargs or len(args) != 1:
            raise ValueError("encoder inputs")
        if isinstance(m, nn.TransformerEncoderLayer):
            return self.encoder_layer(name, m, index[args[0]], pad)
        return self.encoder(name, cast(nn.TransformerEncoder, m), index[args[0]], pad)


def _traced_steps(module: nn.Module) -> list[TracedStep]:
    """privdl's steps for a module whose ``forward`` ``torch.fx`` traces to a graph of supported
    sub-modules (``nn.MultiheadAttention`` as self-attention, ``attn(h, h, h)[0]``, and
    ``nn.TransformerEncoderLayer``/``nn.TransformerEncoder``, ``batch_first``, unmasked, no
    dropout, expanded by :class:`_Steps`), the functions ``relu``/``sigmoid``/``tanh``/``gelu``,
    ``max_pool2d(x, k)``,
    ``avg_pool2d(x, k)``, ``adaptive_avg_pool2d(x, 1)`` and ``flatten(x, 1)``, and sums of two
    tensors (residual connections: ``a + b``, ``out += identity``); every sub-module with
    parameters called once (a shared weight's per-sample gradient is a sum over its uses, which
    the ghost norms do not cover; a parameter-free one such as torchvision's reused ``relu`` may
    recur), no step's output dropped, and no in-place step on a tensor read elsewhere. Anything
    else raises ``ValueError``."""
    import torch.fx

    try:
        graph = torch.fx.symbolic_trace(module).graph
    except Exception as exc:  # noqa: BLE001 - untraceable forward: the generic path
        raise ValueError("untraceable") from exc
    modules = dict(module.named_modules())
    built = _Steps()
    steps = built.steps
    index: dict[Any, int] = {}
    used: set[str] = set()
    tuples: set[Any] = set()  # calls returning (output, weights or final state)
    recurrent: dict[Any, tuple[int, nn.RNNBase]] = {}  # RNN calls: their step, their module
    states: dict[Any, tuple[int, nn.RNNBase]] = {}  # an LSTM's (h_n, c_n)
    finals: dict[Any, tuple[int, nn.RNNBase]] = {}  # h_n (layers x directions, B, H)
    attrs: dict[Any, str] = {}  # get_attr nodes: the module's parameters and buffers read
    masks: dict[Any, int] = {}  # x == pad of the input tokens: attention's key padding masks
    for node in graph.nodes:
        if node.op == "placeholder":
            if index:
                raise ValueError("two inputs")
            index[node] = -1
            continue
        if node.op == "output":
            out = node.args[0]
            if out not in index:
                raise ValueError("output")
            if index[out] != len(steps) - 1:  # the last step must be the output
                raise ValueError("output")
            break
        if _is_padding_mask(node, index):  # used only as an attention's key_padding_mask
            if not all(u.op == "call_module" for u in node.users):
                raise ValueError("mask")
            masks[node] = int(node.args[1])
            continue
        if node.op == "get_attr":  # a parameter or buffer: only as a term of a sum (below)
            attrs[node] = node.target
            continue
        if (
            node.target in _ADDS
            and len(node.args) == 2
            and not node.kwargs
            and ((node.args[0] in attrs) != (node.args[1] in attrs))
        ):
            index[node] = _added_attribute(module, node, index, attrs, used, built)
            continue
        if node.args and node.args[0] in tuples:  # (output, state or weights)
            if node.target is not operator.getitem:
                raise ValueError("tuple output")
            if tuple(node.args[1:]) == (0,):
                index[node] = index[node.args[0]]
            elif tuple(node.args[1:]) == (1,) and node.args[0] in recurrent:
                step, rnn = recurrent[node.args[0]]  # LSTM: (h_n, c_n); GRU, RNN: h_n
                (states if isinstance(rnn, nn.LSTM) else finals)[node] = (step, rnn)
            elif node.users:  # the attention weights, used
                raise ValueError("attention weights")
            continue
        if node.args and node.args[0] in states:  # (h_n, c_n)[0] is h_n
            if node.target is operator.getitem and tuple(node.args[1:]) == (0,):
                finals[node] = states[node.args[0]]
            elif node.users:
                raise ValueError("recurrent cell state")
            continue
        if node.args and node.args[0] in finals:
            index[node] = _last_layer_state(node, finals[node.args[0]], built)
            continue
        if not node.args or node.args[0] not in index:
            raise ValueError("input")
        if not node.users:  # a dead branch: its layers would get no gradient at all
            raise ValueError("unused step")
        in_place = node.target in (operator.iadd, "add_") or (
            node.op == "call_module" and getattr(modules[node.target], "inplace", False)
        )
        if in_place and len(node.args[0].users) > 1:  # the input is read elsewhere too
            raise ValueError("in-place step on a shared input")
        first = index[node.args[0]]
        extra, kwargs = node.args[1:], dict(node.kwargs)
        fn = node.target
        layer: Layer | None = None
        inputs: tuple[int, ...] = (first,)
        name = str(fn)
        if node.op == "call_module":
            sub = modules[node.target]
            if isinstance(sub, nn.RNNBase):  # returns (output, final state)
                if node.target in used:
                    raise ValueError("reused module")
                used.add(node.target)
                index[node] = built.recurrent(node.target, sub, node, index)
                tuples.add(node)
                recurrent[node] = (index[node], sub)
                continue
            if isinstance(sub, _TRANSFORMERS):  # expanded into privdl's steps
                if node.target in used:
                    raise ValueError("reused module")
                used.add(node.target)
                index[node] = built.transformer(node.target, sub, node, index, masks)
                if isinstance(sub, nn.MultiheadAttention):
                    tuples.add(node)
                continue
            has_params = any(True for _ in sub.parameters())
            if (has_params and node.target in used) or extra or kwargs:
                raise ValueError("reused module")  # shared weights (a parameter-free one is fine)
            used.add(node.target)
            layer = _as_layer(sub)
            name = node.target if has_params else f"{node.target}{len(steps)}"
            if layer is None:  # Identity: the step is its input
                index[node] = first
                continue
        elif node.op not in ("call_function", "call_method"):
            raise ValueError(node.op)
        elif fn in _FX_ACTIVATIONS and not extra and kwargs in ({}, {"inplace": False}):
            layer, name = Activation(_FX_ACTIVATIONS[fn]), f"{_FX_ACTIVATIONS[fn]}{len(steps)}"
        elif fn is F.max_pool2d and len(extra) == 1 and _plain_pool(extra[0], kwargs):
            layer, name = MaxPool2d(int(extra[0])), f"pool{len(steps)}"
        elif fn is F.avg_pool2d and len(extra) == 1 and _plain_pool(extra[0], kwargs, avg=True):
            layer, name = AvgPool2d(int(extra[0])), f"pool{len(steps)}"
        elif fn is F.adaptive_avg_pool2d and extra in ((1,), ((1, 1),)) and not kwargs:
            layer, name = AvgPool2d(None), f"pool{len(steps)}"
        elif fn in (torch.flatten, "flatten") and tuple(extra) == (1,) and not kwargs:
            layer, name = Flatten(), f"flatten{len(steps)}"
        elif (dim := _reduced_dim(fn, extra, kwargs)) is not None:
            op = {torch.mean: "mean", torch.sum: "sum", torch.amax: "amax"}.get(fn, fn)
            layer, name = Reduce(str(op), dim), f"{op}{len(steps)}"
        elif fn is operator.getitem and len(extra) == 1 and _per_sample_index(extra[0]):
            layer, name = Index(tuple(extra[0])[1:]), f"index{len(steps)}"
        elif fn in (torch.transpose, "transpose") and len(extra) == 2 and not kwargs:
            if not all(isinstance(d, int) and d != 0 for d in extra):
                raise ValueError("transpose of the batch dimension")
            layer, name = Transpose(int(extra[0]), int(extra[1])), f"transpose{len(steps)}"
        elif fn in _ADDS and len(extra) == 1 and not kwargs and extra[0] in index:
            inputs, name = (first, index[extra[0]]), f"add{len(steps)}"
        else:
            raise ValueError(f"unsupported step {fn}")
        index[node] = len(steps)
        steps.append((name, layer, inputs))
    else:
        raise ValueError("no output")
    return steps


def _last_layer_state(node: Any, source: tuple[int, nn.RNNBase], built: _Steps) -> int:
    """``h_n[-1]`` (or ``h_n[L - 1]``, or ``h_n.squeeze(0)`` for one layer) of a one-direction
    recurrent module: its last layer's state after the last step, the output's last step (an
    :class:`Index` step); ``ValueError`` for any other use of ``h_n``."""
    step, rnn = source
    key = node.args[1] if len(node.args) == 2 else None
    last = (node.target is operator.getitem and key in (-1, rnn.num_layers - 1)) or (
        node.target in ("squeeze", torch.squeeze) and rnn.num_layers == 1 and key in (0, None)
    )
    if rnn.bidirectional or not last or node.kwargs:
        raise ValueError("recurrent final state")
    return built.push(f"last_step{len(built.steps)}", Index((-1,)), (step,))


def _is_padding_mask(node: Any, index: dict[Any, int]) -> bool:
    """``x == pad`` / ``x.eq(pad)`` of the model's input and an integer."""
    return (
        node.target in (operator.eq, torch.eq, "eq")
        and len(node.args) == 2
        and not node.kwargs
        and index.get(node.args[0]) == -1
        and isinstance(node.args[1], int)
        and not isinstance(node.args[1], bool)
    )


def _per_sample_index(key: Any) -> bool:
    """``h[:, i]``-style keys: a full slice over the batch, then integers and full slices."""
    full = slice(None)
    return (
        isinstance(key, tuple)
        and len(key) >= 2
        and key[0] == full
        and all((isinstance(i, int) and not isinstance(i, bool)) or i == full for i in key[1:])
    )


def _added_attribute(
    module: nn.Module,
    node: Any,
    index: dict[Any, int],
    attrs: dict[Any, str],
    used: set[str],
    built: _Steps,
) -> int:
    """``h + self.pos`` (either order, ``+=`` too): an :class:`AddParameter` step for a parameter
    read once, or a constant one for a buffer; ``ValueError`` otherwise."""
    a, attr = node.args if node.args[1] in attrs else node.args[::-1]
    if a not in index:
        raise ValueError("input")
    if not node.users:
        raise ValueError("unused step")
    if node.target in (operator.iadd, "add_") and len(a.users) > 1:
        raise ValueError("in-place step on a shared input")
    key = attrs[attr]
    if len(attr.users) != 1 or key in used:  # a weight used twice: a sum of per-sample grads
        raise ValueError("reused parameter")
    used.add(key)
    try:
        layer = AddParameter(key, tuple(module.get_parameter(key).shape))
    except AttributeError:
        try:
            value = module.get_buffer(key).detach().clone()
        except AttributeError as exc:
            raise ValueError("attribute") from exc
        layer = AddParameter(key, tuple(value.shape), value=value)
    return built.push(f"add_{key}{len(built.steps)}", layer, (index[a],))


def _reduced_dim(fn: Any, extra: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """``d`` for ``x.mean(d)``/``torch.mean(x, d)`` (or ``sum``) over one per-sample dimension,
    ``dim=d`` allowed, ``keepdim`` false; else ``None``."""
    if fn not in (torch.mean, "mean", torch.sum, "sum", torch.amax, "amax"):
        return None
    rest = dict(kwargs)
    if rest.pop("keepdim", False) or rest.pop("dtype", None) is not None:
        return None
    dims = [*extra, *([rest.pop("dim")] if "dim" in rest else [])]
    if rest or len(dims) != 1:
        return None
    dim = dims[0]
    dim = dim[0] if isinstance(dim, (tuple, list)) and len(dim) == 1 else dim
    return dim if isinstance(dim, int) and not isinstance(dim, bool) and dim != 0 else None


def _is_chain(steps: list[TracedStep]) -> bool:
    return all(
        layer is not None and inputs == (i - 1,) for i, (_, layer, inputs) in enumerate(steps)
    )


class GraphModuleModel(StackedModel):
    """A user's module whose traced ``forward`` has residual sums (a graph, not a chain), run as
    privdl's own layers (ghost clipping), with the module's parameter names, order and initial
    weights (from ``source``, as :class:`SequentialModuleModel`)."""

    def __init__(self, source: ModuleModel, steps: list[TracedStep]) -> None:
        self.source, self.steps = source, steps
        self.name, self.in_shape = source.name, source.in_shape
        shapes: list[tuple[int, ...]] = []
        for _, layer, inputs in steps:
            ins = [self.in_shape if i < 0 else shapes[i] for i in inputs]
            if layer is None and ins[0] != ins[1]:
                raise ConfigError(f"module {source.name}: a sum of shapes {ins[0]} and {ins[1]}")
            shapes.append(ins[0] if layer is None else tuple(layer.out_shape(ins[0])))
        self._shapes = shapes
        self.out_shape = shapes[-1]
        readers = [layer for _, layer, inputs in steps if inputs[0] == -1]  # (masks: tokens)
        if any(isinstance(layer, Embedding) for layer in readers):
            if len(readers) != 1:
                raise ConfigError(f"module {source.name}: its index input read by other layers")
            self.takes_indices = True
            self.input_vocabulary = cast(Embedding, readers[0]).num_embeddings
        mine = {
            layer.param_key(name, k): v
            for name, layer, _ in steps
            if layer is not None
            for k, v in layer.param_shapes().items()
        }
        if mine != source.param_shapes() or self.out_shape != source.out_shape:
            raise ConfigError(f"module {source.name}: its layers do not convert one to one")

    def param_shapes(self) -> ParamShapes:
        return self.source.param_shapes()

    def _init_one(self, generator, dtype, device) -> dict[str, Tensor]:
        return self.source._init_one(generator, dtype, device)

    def forward(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        return self.forward_with(params, x, lambda name, layer, lp, a: layer.forward(lp, a))

    def forward_with(self, params: dict[str, Tensor], x: Tensor, apply: LayerApply) -> Tensor:
        """The graph, every layer run as ``apply(name, layer, its params, input)``."""
        values: list[Tensor] = []
        for name, layer, inputs in self.steps:
            ins = [x if i < 0 else values[i] for i in inputs]
            if layer is None:
                values.append(ins[0] + ins[1])
            elif len(ins) == 2:  # attention masked where the input tokens are padding
                values.append(cast(SelfAttention, layer).forward({}, ins[0], tokens=ins[1]))
            else:
                lp = {k: params[layer.param_key(name, k)] for k in layer.param_shapes()}
                values.append(apply(name, layer, lp, ins[0]))
        return values[-1]

    def layer_inputs(self) -> list[tuple[str, Layer, tuple[int, ...]]]:
        """Every layer with the per-sample shape of its input, in run order."""
        return [
            (name, layer, self.in_shape if inputs[0] < 0 else self._shapes[inputs[0]])
            for name, layer, inputs in self.steps
            if layer is not None
        ]


def from_module(
    module: nn.Module | Callable[[], nn.Module],
    *,
    in_shape: tuple[int, ...],
    name: str | None = None,
) -> StackedModel:
    """A stacked model of ``module`` (or of a factory that makes it): privdl's own layers and the
    ghost path when it is an ``nn.Sequential`` of supported layers or a ``forward`` that traces
    (``torch.fx``) to a chain of them, else :class:`ModuleModel`."""
    if isinstance(module, nn.Module):
        source = ModuleModel(module, in_shape=in_shape, name=name)
    else:
        source = ModuleModel(in_shape=in_shape, name=name, factory=module)
    try:
        return SequentialModuleModel(source, _sequential_layers(source.module))
    except (ValueError, ConfigError):
        pass
    try:
        steps = _traced_steps(source.module)
        if _is_chain(steps):
            # _is_chain: no sum steps, so every layer is set
            return SequentialModuleModel(source, [(n, cast(Layer, layer)) for n, layer, _ in steps])
        return GraphModuleModel(source, steps)
    except (ValueError, ConfigError):
        pass
    for sub_name, sub in source.module.named_modules():
        if isinstance(sub, nn.RNNBase):  # torch.func has no batching rule for its kernels
            raise ConfigError(
                f"{type(sub).__name__} ({sub_name}): privdl clips recurrent layers called as "
                "out, _ = rnn(x) or rnn(x)[0] (or reading h_n[-1], one direction) with "
                "batch_first=True, no initial state, no dropout and no proj_size, in a forward "
                "that torch.fx traces"
            )
    return source


def is_module_spec(name: str) -> bool:
    """Whether a model name is a ``package.module:attribute`` spec (not a built-in name)."""
    return MODULE_SPEC.fullmatch(name) is not None


def _call_factory(factory: Callable[[], nn.Module], *, seed: int, name: str) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            made = factory()
        except Exception as exc:  # noqa: BLE001 - the user's constructor
            raise ConfigError(
                f"model {name!r}: calling it failed ({type(exc).__name__}: {exc})"
            ) from None
    if not isinstance(made, nn.Module):
        raise ConfigError(f"model {name!r} made a {type(made).__name__}, not a torch.nn.Module")
    return made


def model_from_spec(spec: str, *, in_shape: tuple[int, ...]) -> StackedModel:
    """The stacked model of ``package.module:Name`` (a module, or a seeded factory)."""
    return from_module(load_module(spec), in_shape=in_shape, name=spec)


def load_module(spec: str) -> nn.Module | Callable[[], nn.Module]:
    """Import ``package.module:attribute``: the ``nn.Module`` it names, or its factory."""
    m = MODULE_SPEC.fullmatch(spec)
    if m is None:
        raise ConfigError(f"model {spec!r} is not of the form package.module:Name")
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        with torch.random.fork_rng(devices=[]):  # modules made at import: the same everywhere
            torch.manual_seed(0)
            mod = importlib.import_module(m["module"])
    except Exception as exc:  # noqa: BLE001 - ImportError or an error in the user's module
        raise ConfigError(
            f"model {spec!r}: cannot import {m['module']!r} ({type(exc).__name__}: {exc})"
        ) from None
    finally:
        if added:
            sys.path.remove(cwd)
    obj = mod
    for part in m["attr"].split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"model {spec!r}: {m['module']!r} has no attribute {m['attr']!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, nn.Module) and not callable(obj):
        raise ConfigError(f"model {spec!r} is neither an nn.Module nor callable")
    return obj
