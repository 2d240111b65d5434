"""Bring your own ``torch.nn.Module``: a :class:`StackedModel` over any stateless module.

``ModuleModel(module, in_shape=...)`` runs ``module`` for every node at once: its parameters are
stacked over nodes and ``forward`` is ``torch.func.vmap`` over nodes of
``torch.func.functional_call(module, params_i, (x_i,))``. Per-sample gradients then come from the
engine's ``vmap(grad)`` path, so any module torch.func can differentiate works.

:func:`from_module` (what ``--model package.module:Name`` uses) first tries the fast path: an
``nn.Sequential`` (nested ones too) of ``Linear``, ``Conv2d`` (square kernel, one group, no
dilation, zero padding), ``GroupNorm``, ``ReLU``/``Sigmoid``/``Tanh``, ``MaxPool2d`` and
``AvgPool2d`` (stride = kernel), ``AdaptiveAvgPool2d(1)``, ``Flatten`` and ``Identity``, or a
``forward`` that ``torch.fx`` traces to a plain chain of them and of ``relu``/``sigmoid``/
``tanh``/``max_pool2d(x, k)``/``avg_pool2d(x, k)``/``adaptive_avg_pool2d(x, 1)``/
``flatten(x, 1)`` calls, becomes a
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
Dropout (a random forward pass that the vectorized per-sample gradients cannot redraw per
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
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from privdl.errors import ConfigError
from privdl.models.base import (
    ACTIVATIONS,
    Activation,
    AvgPool2d,
    Conv2d,
    Flatten,
    GroupNorm,
    Layer,
    Linear,
    MaxPool2d,
    ParamShapes,
    SequentialModel,
    StackedModel,
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
        "remove it",
    ),
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
            for kind, why in _REFUSED:
                if isinstance(sub, kind):
                    where = f" ({sub_name})" if sub_name else ""
                    raise ConfigError(f"{type(sub).__name__}{where} {why}")
        self.module = copy.deepcopy(module).requires_grad_(False)
        self.name = name or type(module).__name__
        self.in_shape = tuple(int(s) for s in in_shape)
        self._weights = {k: v.detach().clone() for k, v in module.named_parameters()}
        if not self._weights:
            raise ConfigError(f"module {self.name} has no parameters to train")
        ref = next(iter(self._weights.values()))
        try:
            with torch.no_grad():
                out = self.module(torch.zeros(2, *self.in_shape, dtype=ref.dtype))
        except Exception as exc:  # noqa: BLE001 - any failure of the user's forward
            raise ConfigError(
                f"module {self.name} failed on a batch of shape (B, {', '.join(map(str, self.in_shape))}): "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if not torch.is_tensor(out) or out.ndim < 1 or out.shape[0] != 2:
            raise ConfigError(f"module {self.name} must map (B, *in_shape) to (B, *out_shape)")
        self.out_shape = tuple(out.shape[1:])

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

        return vmap(one_node)(params, x)


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
    if isinstance(m, nn.Identity):
        return None
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
    if type(m) in _MODULE_ACTIVATIONS:
        return Activation(_MODULE_ACTIVATIONS[type(m)])
    if type(m) is nn.MaxPool2d:
        k = _pair(m.kernel_size, "pool")
        if _pair(m.stride, "pool") != k or _pair(m.padding, "pool") != 0:
            raise ValueError("pool")
        if _pair(m.dilation, "pool") != 1 or m.ceil_mode or m.return_indices:
            raise ValueError("pool")
        return MaxPool2d(k)
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
    if type(m) is nn.Flatten and m.start_dim == 1 and m.end_dim == -1:
        return Flatten()
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
_FX_ACTIVATIONS = {
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


def _traced_layers(module: nn.Module) -> list[tuple[str, Layer]]:
    """privdl's layers for a module whose ``forward`` is a plain chain (each step takes only the
    previous step's output) of supported sub-modules and the functions ``relu``/``sigmoid``/
    ``tanh``, ``max_pool2d(x, k)`` and ``flatten(x, 1)``, as ``torch.fx`` traces it; a chain
    that calls a sub-module twice, branches or does anything else raises ``ValueError``."""
    import torch.fx

    try:
        graph = torch.fx.symbolic_trace(module).graph
    except Exception as exc:  # noqa: BLE001 - untraceable forward: the generic path
        raise ValueError("untraceable") from exc
    modules = dict(module.named_modules())
    layers: list[tuple[str, Layer]] = []
    used: set[str] = set()
    prev = None
    for node in graph.nodes:
        if node.op == "placeholder":
            if prev is not None:
                raise ValueError("two inputs")
            prev = node
            continue
        if node.op == "output":
            if node.args[0] is not prev:
                raise ValueError("output")
            break
        if not node.args or node.args[0] is not prev or len(node.users) > 1:
            raise ValueError("not a chain")
        extra, kwargs = node.args[1:], dict(node.kwargs)
        if node.op == "call_module":
            if node.target in used or extra or kwargs:
                raise ValueError("reused module")
            used.add(node.target)
            layer = _as_layer(modules[node.target])
            if layer is not None:
                layers.append((node.target, layer))
        elif node.op in ("call_function", "call_method"):
            fn = node.target
            if fn in _FX_ACTIVATIONS and not extra and kwargs in ({}, {"inplace": False}):
                layers.append(
                    (f"{_FX_ACTIVATIONS[fn]}{len(layers)}", Activation(_FX_ACTIVATIONS[fn]))
                )
            elif (
                fn is torch.nn.functional.max_pool2d
                and len(extra) == 1
                and _plain_pool(extra[0], kwargs)
            ):
                layers.append((f"pool{len(layers)}", MaxPool2d(int(extra[0]))))
            elif (
                fn is torch.nn.functional.avg_pool2d
                and len(extra) == 1
                and _plain_pool(extra[0], kwargs, avg=True)
            ):
                layers.append((f"pool{len(layers)}", AvgPool2d(int(extra[0]))))
            elif (
                fn is torch.nn.functional.adaptive_avg_pool2d
                and extra in ((1,), ((1, 1),))
                and not kwargs
            ):
                layers.append((f"pool{len(layers)}", AvgPool2d(None)))
            elif fn in (torch.flatten, "flatten") and tuple(extra) == (1,) and not kwargs:
                layers.append((f"flatten{len(layers)}", Flatten()))
            else:
                raise ValueError(f"unsupported step {fn}")
        else:
            raise ValueError(node.op)
        prev = node
    return layers


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
    for convert in (_sequential_layers, _traced_layers):
        try:
            return SequentialModuleModel(source, convert(source.module))
        except (ValueError, ConfigError):
            continue
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
