"""Optax-style optimizers for node-stacked parameter trees.

Every leaf of a tree has the number of nodes ``n`` as leading dimension, so one call updates the
optimizer state of all nodes at once (no loop over nodes). An optimizer is a pair of pure
functions with explicit state: ``state = opt.init(params)`` and
``delta, state = opt.update(grads, state, params, lr=eta_t)``; the caller applies
``params + delta`` and owns the step-size schedule ``eta_t``. Nothing is updated in place.

The reference semantics are the algorithms documented for ``torch.optim.SGD``,
``torch.optim.Adam`` and ``torch.optim.AdamW`` (the pseudo-code on their pages under
https://pytorch.org/docs/stable/optim.html; ``maximize``, ``amsgrad`` and complex parameters are
not supported), applied to each node separately; the tests compare against torch.optim itself.

Privacy: an optimizer only post-processes the privatized (clipped and noised) gradient and the
node's own parameters, so by the post-processing property of differential privacy the privacy
accounting of a run is the same whichever optimizer it uses.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from privdl.errors import ConfigError

Tree = dict[str, torch.Tensor]
#: What torch's ``_foreach`` kernels take and return: the leaves of a tree, in key order.
Leaves = tuple[torch.Tensor, ...] | list[torch.Tensor]


@dataclass(frozen=True)
class OptState:
    """``step``: updates done so far; ``buffers``: named trees (each leaf of shape (n, ...)).

    A stateless optimizer (plain SGD) has no buffers and never changes its state.
    """

    step: int = 0
    buffers: Mapping[str, Tree] = field(default_factory=dict)


@runtime_checkable
class Optimizer(Protocol):
    """``init`` makes the state of all nodes; ``update`` returns the step ``delta`` (the new
    parameters are ``params + delta``) and the next state, without changing its arguments."""

    def init(self, params: Tree) -> OptState: ...

    def update(
        self, grads: Tree, state: OptState, params: Tree, *, lr: float
    ) -> tuple[Tree, OptState]: ...


def state_tensors(state: OptState) -> dict[str, torch.Tensor]:
    """Flat checkpoint view: ``{"step": int64 scalar, "<buffer>/<leaf>": (n, ...) tensor}``.

    Empty for a stateless optimizer."""
    if not state.buffers:
        return {}
    out = {"step": torch.tensor(state.step, dtype=torch.int64)}
    for name, tree in state.buffers.items():
        out.update({f"{name}/{key}": t for key, t in tree.items()})
    return out


def load_state_tensors(state: OptState, tensors: Mapping[str, torch.Tensor]) -> OptState:
    """The state ``tensors`` (from :func:`state_tensors`) describe, shaped like the template
    ``state`` (typically a fresh ``opt.init(params)``), on its devices and dtypes."""
    expected = state_tensors(state)
    if expected.keys() != tensors.keys():
        missing, extra = sorted(expected.keys() - tensors.keys()), sorted(tensors.keys() - expected)
        raise ConfigError(
            f"optimizer state does not match this optimizer: missing {missing}, unexpected {extra}"
        )
    buffers: dict[str, Tree] = {name: {} for name in state.buffers}
    for flat, ref in expected.items():
        if flat == "step":
            continue
        t = tensors[flat]
        if t.shape != ref.shape:
            raise ConfigError(
                f"optimizer state {flat!r} has shape {tuple(t.shape)}, expected {tuple(ref.shape)}"
            )
        name, key = flat.split("/", 1)
        buffers[name][key] = t.detach().to(device=ref.device, dtype=ref.dtype)
    return OptState(step=int(tensors["step"]) if expected else state.step, buffers=buffers)


def _leaves(tree: Tree, keys: list[str], what: str) -> Leaves:
    if tree.keys() != set(keys):
        raise ValueError(f"{what} has leaves {sorted(tree)}, expected {sorted(keys)}")
    return [tree[k] for k in keys]


def _tree(keys: list[str], leaves: Leaves) -> Tree:
    return dict(zip(keys, leaves, strict=True))


class _Spec:
    def to_dict(self) -> dict[str, Any]:
        """The JSON-able spec that :func:`parse_optimizer` turns back into this optimizer."""
        return {"name": type(self).__name__.lower(), **dataclasses.asdict(self)}  # type: ignore

    def describe(self) -> str:
        """One line such as ``sgd(momentum=0.9, ...)``."""
        d = self.to_dict()
        return d.pop("name") + "(" + ", ".join(f"{k}={v!r}" for k, v in d.items()) + ")"


@dataclass(frozen=True)
class SGD(_Spec):
    """Stochastic gradient descent with optional momentum and weight decay (torch.optim.SGD).

    With weight decay ``lambda``, momentum ``mu``, dampening ``tau`` and step ``t = 1, 2, ...``::

        g_t = grad_t + lambda * theta_{t-1}
        b_t = g_t                                  if t == 1
        b_t = mu * b_{t-1} + (1 - tau) * g_t       otherwise   (only when mu != 0)
        d_t = g_t + mu * b_t  if nesterov  else  b_t           (d_t = g_t when mu == 0)
        delta_t = -lr * d_t

    Plain SGD (``mu == lambda == 0``) is stateless and its delta is exactly ``-lr * grads``
    bit for bit, so ``params + delta`` equals ``params - lr * grads``.
    """

    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if not (self.momentum >= 0 and self.dampening >= 0 and self.weight_decay >= 0):
            raise ConfigError(f"sgd needs momentum, dampening, weight_decay >= 0, got {self}")
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ConfigError("sgd: nesterov=True needs momentum > 0 and dampening = 0")

    def init(self, params: Tree) -> OptState:
        if self.momentum == 0:
            return OptState()
        return OptState(0, {"momentum": {k: torch.zeros_like(p) for k, p in params.items()}})

    def update(
        self, grads: Tree, state: OptState, params: Tree, *, lr: float
    ) -> tuple[Tree, OptState]:
        if self.momentum == 0 and self.weight_decay == 0:
            return {k: g * -lr for k, g in grads.items()}, state
        keys = list(params)
        d: Leaves
        g: Leaves
        d = g = _leaves(grads, keys, "grads")
        if self.weight_decay != 0:
            d = g = torch._foreach_add(g, _leaves(params, keys, "params"), alpha=self.weight_decay)
        if self.momentum != 0:
            buf: Leaves
            if state.step == 0:
                buf = [x.clone() for x in g]
            else:
                buf = torch._foreach_mul(
                    _leaves(state.buffers["momentum"], keys, "momentum"), self.momentum
                )
                torch._foreach_add_(buf, g, alpha=1 - self.dampening)
            d = torch._foreach_add(g, buf, alpha=self.momentum) if self.nesterov else buf
            state = OptState(state.step + 1, {"momentum": _tree(keys, buf)})
        return _tree(keys, torch._foreach_mul(d, -lr)), state


@dataclass(frozen=True)
class Adam(_Spec):
    """Adam (torch.optim.Adam) or, with ``decoupled=True``, AdamW (torch.optim.AdamW).

    With betas ``(b1, b2)``, weight decay ``lambda`` and step ``t = 1, 2, ...``::

        g_t = grad_t + lambda * theta_{t-1}       (Adam; AdamW uses g_t = grad_t)
        m_t = b1 * m_{t-1} + (1 - b1) * g_t       (m_0 = v_0 = 0)
        v_t = b2 * v_{t-1} + (1 - b2) * g_t**2
        delta_t = -lr * (m_t / (1 - b1**t)) / (sqrt(v_t / (1 - b2**t)) + eps)
                  [- lr * lambda * theta_{t-1}   for AdamW]
    """

    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = False

    def __post_init__(self) -> None:
        b1, b2 = self.betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1 and self.eps >= 0 and self.weight_decay >= 0):
            raise ConfigError(f"adam needs 0 <= betas < 1, eps >= 0, weight_decay >= 0, got {self}")

    def init(self, params: Tree) -> OptState:
        zeros = [{k: torch.zeros_like(p) for k, p in params.items()} for _ in range(2)]
        return OptState(0, {"exp_avg": zeros[0], "exp_avg_sq": zeros[1]})

    def update(
        self, grads: Tree, state: OptState, params: Tree, *, lr: float
    ) -> tuple[Tree, OptState]:
        (b1, b2), t, keys = self.betas, state.step + 1, list(params)
        g = _leaves(grads, keys, "grads")
        p = _leaves(params, keys, "params")
        if self.weight_decay != 0 and not self.decoupled:
            g = torch._foreach_add(g, p, alpha=self.weight_decay)
        m = torch._foreach_mul(_leaves(state.buffers["exp_avg"], keys, "exp_avg"), b1)
        torch._foreach_add_(m, g, alpha=1 - b1)
        v = torch._foreach_mul(_leaves(state.buffers["exp_avg_sq"], keys, "exp_avg_sq"), b2)
        torch._foreach_addcmul_(v, g, g, value=1 - b2)
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, math.sqrt(1 - b2**t))
        torch._foreach_add_(denom, self.eps)
        delta = torch._foreach_div(m, denom)
        torch._foreach_mul_(delta, -lr / (1 - b1**t))
        if self.weight_decay != 0 and self.decoupled:
            torch._foreach_add_(delta, p, alpha=-lr * self.weight_decay)
        buffers = {"exp_avg": _tree(keys, m), "exp_avg_sq": _tree(keys, v)}
        return _tree(keys, delta), OptState(t, buffers)

    def to_dict(self) -> dict[str, Any]:
        d = {**dataclasses.asdict(self), "betas": list(self.betas)}
        return {"name": "adamw" if d.pop("decoupled") else "adam", **d}


def sgd(
    *,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
) -> SGD:
    """torch.optim.SGD semantics; see :class:`SGD`."""
    return SGD(float(momentum), float(dampening), bool(nesterov), float(weight_decay))


def adam(
    *,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    decoupled: bool = False,
) -> Adam:
    """torch.optim.Adam semantics, or torch.optim.AdamW if ``decoupled``; see :class:`Adam`."""
    b1, b2 = betas
    return Adam((float(b1), float(b2)), float(eps), float(weight_decay), bool(decoupled))


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


_KINDS = {
    "a number": _number,
    "true or false": lambda x: isinstance(x, bool),
    "a pair of numbers": lambda x: (
        isinstance(x, (list, tuple)) and len(x) == 2 and all(map(_number, x))
    ),
}
_NUM, _BOOL, _PAIR = _KINDS
_OPTIONS = {
    "sgd": {"momentum": _NUM, "dampening": _NUM, "nesterov": _BOOL, "weight_decay": _NUM},
    "adam": {"betas": _PAIR, "eps": _NUM, "weight_decay": _NUM, "decoupled": _BOOL},
    "adamw": {"betas": _PAIR, "eps": _NUM, "weight_decay": _NUM},
}


def parse_optimizer(spec: str | Mapping[str, Any] | Optimizer) -> Optimizer:
    """An optimizer from ``"sgd"``, ``"adam"``, ``"adamw"``, a mapping such as
    ``{"name": "sgd", "momentum": 0.9}`` (the form ``to_dict()`` returns) or an optimizer.

    ``"adamw"`` takes torch.optim.AdamW's default ``weight_decay=0.01`` unless given."""
    if not isinstance(spec, (str, Mapping)) and isinstance(spec, Optimizer):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping):
        raise ConfigError(f"optimizer must be a name or a mapping with a 'name', got {spec!r}")
    options = dict(spec)
    name = options.pop("name", None)
    choices = ", ".join(_OPTIONS)
    if not isinstance(name, str) or name.strip().lower() not in _OPTIONS:
        raise ConfigError(f"unknown optimizer {name!r}; choose one of: {choices}")
    name = name.strip().lower()
    accepted = _OPTIONS[name]
    for key, value in options.items():
        if key not in accepted:
            raise ConfigError(
                f"unknown option {key!r} for optimizer {name!r}; accepted: {', '.join(accepted)}"
            )
        if not _KINDS[accepted[key]](value):
            raise ConfigError(
                f"optimizer {name!r}: option {key!r} must be {accepted[key]}, got {value!r}"
            )
    if name == "sgd":
        return sgd(**options)
    if name == "adamw":
        options = {"weight_decay": 0.01, **options, "decoupled": True}
    return adam(**options)
