"""Trained privdl models back as plain ``torch.nn.Module`` objects.

privdl keeps a model's weights as a node-stacked tree (``dict[str, Tensor]``, one row per node)
and runs them through a :class:`~privdl.models.base.StackedModel`. Users coming from Opacus or
plain PyTorch expect their trained ``nn.Module`` back, to evaluate, save with ``state_dict``,
fine-tune or ship. This module gives it:

* :func:`to_module` — one model's parameters (no node dimension: row ``i`` of a stacked tree, or
  the mean over nodes) as an ``nn.Module``;
* :func:`node_modules` — one module per node of a stacked tree;
* :func:`average_module` — the module of the mean over nodes (the "averaged model" of
  decentralized learning).

What comes back, by model kind:

* :class:`~privdl.models.module.ModuleModel`, ``SequentialModuleModel`` and ``GraphModuleModel``
  (your own module, e.g. from :func:`~privdl.models.module.from_module`): a deep copy of your
  module with its parameters replaced by the given ones (same names, tied weights kept tied);
* :class:`~privdl.models.base.SequentialModel` of privdl's layers: an ``nn.Sequential`` of
  ``nn.Linear``, ``nn.Conv2d``, ``nn.GroupNorm``, ``nn.ReLU``/``Sigmoid``/``Tanh``,
  ``nn.MaxPool2d``, ``nn.AvgPool2d``, ``nn.AdaptiveAvgPool2d(1)`` and ``nn.Flatten``, named as
  privdl's layers (so ``state_dict`` keys equal privdl's parameter names);
* :class:`~privdl.models.resnet.StackedResNet`: a torchvision-style ResNet of those layers, with
  privdl's (torchvision's) parameter names;
* any other model: :class:`StackedRow`, which runs ``model.forward`` on a one-row stack.

Guarantee: the returned module is in eval mode, its parameters are fresh leaf tensors
(``requires_grad=True``) on the params' device and dtype, and on a batch ``x`` of shape
``(B, *in_shape)`` it gives ``model.forward({k: v.unsqueeze(0) for k, v in params.items()},
x.unsqueeze(0))[0]`` up to float rounding (exactly for :class:`StackedRow`; native layers run the
same maths through torch's unstacked kernels).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import cast

import torch
from torch import Tensor, nn

from privdl.errors import ConfigError
from privdl.models.base import (
    Activation,
    AvgPool2d,
    Conv2d,
    Flatten,
    GroupNorm,
    Layer,
    Linear,
    MaxPool2d,
    SequentialModel,
    StackedModel,
)
from privdl.models.module import GraphModuleModel, ModuleModel, SequentialModuleModel
from privdl.models.resnet import StackedResNet
from privdl.models.sequence import Conv1d, Embedding, LayerNorm

__all__ = ["StackedRow", "average_module", "node_modules", "to_module"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "gelu": nn.GELU,
}  # fmt: skip


def to_module(model: StackedModel, params: dict[str, Tensor]) -> nn.Module:
    """``params`` (ONE model's parameters, no node dimension) as a plain ``nn.Module`` in eval
    mode that computes what ``model`` computes (see the module docstring for what each model kind
    becomes). A missing, unknown or misshapen parameter raises :class:`ConfigError`."""
    _check_params(model, params)
    module: nn.Module | None
    if isinstance(model, (SequentialModuleModel, GraphModuleModel)):
        module = _user_module(model.source, params)
    elif isinstance(model, ModuleModel):
        module = _user_module(model, params)
    elif (module := _native(model)) is not None:
        _load(module, params)
    else:
        return StackedRow(model, params)
    return module.eval()


def node_modules(model: StackedModel, stacked: dict[str, Tensor]) -> list[nn.Module]:
    """One module per node: ``to_module(model, {k: v[i]})`` for every row ``i`` of ``stacked``."""
    n = _n_rows(model, stacked)
    return [to_module(model, {k: v[i] for k, v in stacked.items()}) for i in range(n)]


def average_module(model: StackedModel, stacked: dict[str, Tensor]) -> nn.Module:
    """The module of the mean over nodes of ``stacked`` (the averaged model)."""
    _n_rows(model, stacked)
    return to_module(model, {k: v.mean(dim=0) for k, v in stacked.items()})


class StackedRow(nn.Module):
    """Generic fallback: ``model`` run on one parameter row, as an ``nn.Module``.

    :func:`to_module` returns it for any model it does not convert to native torch layers. The
    parameters are registered under privdl's names (nested sub-modules for the dotted parts, so
    ``named_parameters`` and ``state_dict`` keys equal ``model.param_shapes()``); ``forward(x)``
    with ``x (B, *in_shape)`` is ``model.forward(params[None], x[None])[0]``, exactly.
    """

    def __init__(self, model: StackedModel, params: dict[str, Tensor]) -> None:
        super().__init__()
        _check_params(model, params)
        self.stacked_model = model
        self.param_names = list(params)
        for name, value in params.items():
            *path, leaf = name.split(".")
            owner: nn.Module = self
            try:
                for part in path:
                    if part not in owner._modules:
                        owner.add_module(part, nn.Module())
                    owner = owner.get_submodule(part)
                owner.register_parameter(leaf, nn.Parameter(value.detach().clone()))
            except (KeyError, AttributeError, TypeError) as exc:
                raise ConfigError(
                    f"cannot register parameter {name!r} on a module: {exc}"
                ) from None
        self.eval()

    def forward(self, x: Tensor) -> Tensor:
        params = {k: self.get_parameter(k).unsqueeze(0) for k in self.param_names}
        return self.stacked_model.forward(params, x.unsqueeze(0))[0]


# --------------------------------------------------------------------------------------------
# Checks and parameter loading


def _check_params(model: StackedModel, params: dict[str, Tensor]) -> None:
    shapes = model.param_shapes()
    missing, unknown = sorted(set(shapes) - set(params)), sorted(set(params) - set(shapes))
    if missing or unknown:
        raise ConfigError(
            f"parameters do not match model {model.name!r}: missing {missing}, unknown {unknown}"
        )
    for key, shape in shapes.items():
        value = params[key]
        if not isinstance(value, Tensor) or not value.is_floating_point():
            raise ConfigError(f"parameter {key!r} must be a floating-point tensor")
        got = tuple(value.shape)
        if got != tuple(shape):
            hint = ""
            if got[1:] == tuple(shape):
                hint = " (it looks node-stacked: pass one row, or use node_modules/average_module)"
            raise ConfigError(
                f"parameter {key!r} of model {model.name!r} has shape {got}, expected "
                f"{tuple(shape)}{hint}"
            )


def _n_rows(model: StackedModel, stacked: dict[str, Tensor]) -> int:
    """The common leading size of a stacked tree; :class:`ConfigError` if there is none."""
    rows = {int(v.shape[0]) if isinstance(v, Tensor) and v.dim() else -1 for v in stacked.values()}
    if len(rows) != 1 or min(rows) < 1:
        raise ConfigError(
            f"stacked parameters of model {model.name!r} need one common leading node "
            f"dimension of at least 1 row, got leading sizes {sorted(rows)} (-1: none)"
        )
    return rows.pop()


def _load(module: nn.Module, params: dict[str, Tensor]) -> None:
    """Replace every parameter of ``module`` (and each alias of a tied one) by a fresh leaf
    ``nn.Parameter`` holding a copy of ``params[name]``."""
    aliases: dict[int, list[str]] = {}
    canonical: dict[int, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
        canonical.setdefault(id(p), name)
    names = set(canonical.values())
    if names != set(params):
        raise ConfigError(
            f"module parameters {sorted(names)} do not match the given {sorted(params)}"
        )
    for pid, name in canonical.items():
        new = nn.Parameter(params[name].detach().clone())
        for alias in aliases[pid]:
            owner_path, _, leaf = alias.rpartition(".")
            setattr(module.get_submodule(owner_path), leaf, new)


def _user_module(source: ModuleModel, params: dict[str, Tensor]) -> nn.Module:
    """A deep copy of the user's module with ``params`` as its parameters."""
    module = copy.deepcopy(source.module)
    module.to(next(iter(params.values())).device)  # buffers follow the parameters, as in
    # ModuleModel.forward (their dtype stays: forward uses them as they are)
    _load(module, params)
    return module


# --------------------------------------------------------------------------------------------
# privdl layers as torch layers


def _torch_layer(layer: Layer) -> nn.Module | None:
    """The torch module computing ``layer`` on one node (created on "meta": no init cost; every
    parameter is replaced by :func:`_load`); ``None`` when there is none."""
    meta = torch.device("meta")
    if type(layer) is Linear:
        return nn.Linear(layer.in_features, layer.out_features, bias=layer.bias, device=meta)
    if type(layer) is Conv2d:
        return nn.Conv2d(
            layer.in_channels,
            layer.out_channels,
            layer.kernel_size,
            stride=layer.stride,
            padding=layer.padding,
            bias=layer.bias,
            device=meta,
        )
    if type(layer) is GroupNorm:
        return nn.GroupNorm(
            layer.num_groups, layer.num_channels, eps=layer.eps, affine=layer.affine, device=meta
        )
    if type(layer) is Activation and layer.name in _ACTIVATIONS:
        return _ACTIVATIONS[layer.name]()
    if type(layer) is MaxPool2d:
        return nn.MaxPool2d(layer.kernel_size, stride=layer.stride, padding=layer.padding)
    if type(layer) is AvgPool2d:
        if layer.kernel_size is None:
            return nn.AdaptiveAvgPool2d(1)
        return nn.AvgPool2d(layer.kernel_size)
    if type(layer) is Flatten:
        return nn.Flatten()
    if type(layer) is Conv1d:
        return nn.Conv1d(
            layer.in_channels, layer.out_channels, layer.kernel_size, stride=layer.stride,
            padding=layer.padding, bias=layer.bias, device=meta,
        )  # fmt: skip
    if type(layer) is LayerNorm:
        return nn.LayerNorm(
            layer.normalized_shape, eps=layer.eps, elementwise_affine=layer.affine,
            bias=layer.bias, device=meta,
        )  # fmt: skip
    if type(layer) is Embedding:
        return nn.Embedding(
            layer.num_embeddings, layer.embedding_dim, padding_idx=layer.padding_idx, device=meta
        )
    return None


def _native(model: StackedModel) -> nn.Module | None:
    """A module of torch layers with the model's parameter names, or ``None`` (the fallback)."""
    if isinstance(model, SequentialModel) and all(
        getattr(type(model), m) is getattr(SequentialModel, m)
        for m in ("forward", "forward_with", "layer_params")
    ):  # a subclass that runs its layers differently takes the fallback
        return _sequential(model)
    if type(model) is StackedResNet:
        return _ResNet(model)
    return None


def _sequential(model: SequentialModel) -> nn.Module | None:
    names = [lname for lname, _ in model.layers]
    if len(set(names)) != len(names) or any(not n or "." in n for n in names):
        return None  # not valid nn.Sequential names: the fallback keeps privdl's names
    children = OrderedDict((lname, _torch_layer(layer)) for lname, layer in model.layers)
    if any(m is None for m in children.values()):
        return None  # a layer with no torch twin
    return nn.Sequential(cast("OrderedDict[str, nn.Module]", children))


class _BasicBlock(nn.Module):
    """torchvision's BasicBlock; ``bn*`` are ``nn.GroupNorm`` or ``nn.Identity`` (no norm)."""

    def __init__(self, conv1, bn1, conv2, bn2, downsample: nn.Module | None) -> None:
        super().__init__()
        self.conv1, self.bn1, self.conv2, self.bn2 = conv1, bn1, conv2, bn2
        self.relu = nn.ReLU()
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class _ResNet(nn.Module):
    """torchvision-style ResNet of :class:`_BasicBlock`, with privdl's parameter names; global
    average pool (``avgpool``) or the final map flattened, then ``fc``."""

    def __init__(self, model: StackedResNet) -> None:
        super().__init__()
        layers = model._layers  # every parameterised name and the stateless steps

        def get(name: str) -> nn.Module:
            out = _torch_layer(layers[name])
            if out is None:  # pragma: no cover - StackedResNet uses convertible layers only
                raise ConfigError(f"cannot convert layer {name!r} of {model.name!r}")
            return out

        def norm(name: str) -> nn.Module:  # absent when norm_groups is None
            return get(name) if name in layers else nn.Identity()

        self.conv1, self.bn1 = get("conv1"), norm("bn1")
        self.relu, self.maxpool = nn.ReLU(), get("maxpool")
        stages: dict[str, list[nn.Module]] = {}
        for prefix, _, down in model._plan:
            downsample = None
            if down:
                parts = [get(f"{prefix}.downsample.0")]
                if f"{prefix}.downsample.1" in layers:
                    parts.append(get(f"{prefix}.downsample.1"))
                downsample = nn.Sequential(*parts)
            # one tuple (the same calls in the same order): mypy counts a tuple's *-arguments
            convs = (
                get(f"{prefix}.conv1"),
                norm(f"{prefix}.bn1"),
                get(f"{prefix}.conv2"),
                norm(f"{prefix}.bn2"),
            )
            stages.setdefault(prefix.split(".")[0], []).append(_BasicBlock(*convs, downsample))
        for stage, blocks in stages.items():
            self.add_module(stage, nn.Sequential(*blocks))
        self.stages = list(stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1) if model.avgpool else nn.Identity()
        self.flatten, self.fc = nn.Flatten(), get("fc")

    def forward(self, x: Tensor) -> Tensor:
        h = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage in self.stages:
            h = getattr(self, stage)(h)
        return self.fc(self.flatten(self.avgpool(h)))
