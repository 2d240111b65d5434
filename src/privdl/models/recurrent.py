"""Recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) as privdl layers, for the ghost path.

Every layer of a recurrent network applies two Linear maps at every time step: the input one,
``W_ih x_t + b_ih``, and the recurrent one, ``W_hh h_{t-1} + b_hh``. A sample's gradient of each
is a sum over its time steps, ``sum_t G_t a_t^T`` (``a_t`` the step's input, ``x_t`` or
``h_{t-1}``; ``G_t`` the gradient of the loss at that map's output), which is the per-sample
gradient of a Linear applied at ``T`` positions: the engine's positional rule forms its norm
directly or as ``<G G^T, A A^T>`` and the clipped sum as one batched product
(:mod:`privdl.engine.ghost`), as Opacus's ``DPLSTM`` does with per-sample gradients. The input
map runs once over all steps; the recurrent one's outputs are read through a zero "probe" added
at each step, whose gradient is ``G_t``. The gate equations are torch's (``nn.LSTM``, ``nn.GRU``,
``nn.RNN`` documentation; Hochreiter and Schmidhuber 1997, Cho et al. 2014), with the gates in
torch's order (i, f, g, o and r, z, n), the zero initial state and ``batch_first=True``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from privdl.errors import ConfigError
from privdl.models.base import Layer, Linear, ParamShapes

__all__ = ["Recurrent", "RecurrentProjection"]

Mode = Literal["LSTM", "GRU", "RNN_TANH", "RNN_RELU"]
_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}

#: A recorded Linear map for the ghost path: (the map, its params, its inputs, its outputs).
Record = tuple["RecurrentProjection", dict[str, Tensor], Tensor, Tensor]


class RecurrentProjection(Linear):
    """One of a recurrent layer's two Linear maps, named as torch names it (``weight_ih_l0``,
    ``bias_hh_l1``, ...)."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, suffix: str) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.suffix = suffix  # "ih_l0", "hh_l0", ...

    def local_key(self, key: str) -> str:
        """``weight`` -> ``weight_ih_l0``: the name within the recurrent module."""
        return f"{key}_{self.suffix}"

    def param_key(self, name: str, key: str) -> str:
        return f"{name}.{self.local_key(key)}"


class Recurrent(Layer):
    """A stack of ``num_layers`` recurrent layers over a sample's ``T`` steps: input
    ``(n, B, T, input_size)``, output ``(n, B, T, D hidden_size)`` (the last layer's hidden states,
    ``output`` of ``nn.LSTM(..., batch_first=True)``; ``D = 2`` when ``bidirectional``: the
    forward and the reverse direction's states side by side, the reverse one run over the
    reversed steps)."""

    def __init__(
        self,
        mode: Mode,
        input_size: int,
        hidden_size: int,
        *,
        num_layers: int = 1,
        bias: bool = True,
        bidirectional: bool = False,
    ) -> None:
        if mode not in _GATES:
            raise ConfigError(f"Recurrent: unknown mode {mode!r}")
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.num_layers, self.bias, self.bidirectional = num_layers, bias, bidirectional
        width, directions = _GATES[mode] * hidden_size, 2 if bidirectional else 1
        self.maps = [
            [
                (
                    RecurrentProjection(input_size if k == 0 else directions * hidden_size,
                                        width, bias=bias, suffix=f"ih_l{k}{tail}"),
                    RecurrentProjection(hidden_size, width, bias=bias, suffix=f"hh_l{k}{tail}"),
                )
                for tail in ("", "_reverse")[:directions]
            ]
            for k in range(num_layers)
        ]  # fmt: skip

    def param_shapes(self) -> ParamShapes:
        return {
            m.local_key(key): shape
            for layer in self.maps
            for pair in layer
            for m in pair
            for key, shape in m.param_shapes().items()
        }

    def out_shape(self, in_shape):
        if len(in_shape) != 2 or in_shape[1] != self.input_size:
            raise ConfigError(
                f"{self.mode}({self.input_size}, {self.hidden_size}) on samples of shape "
                f"{tuple(in_shape)}: expected (steps, {self.input_size})"
            )
        return (in_shape[0], len(self.maps[0]) * self.hidden_size)

    def forward(self, params, a):
        return self.run(params, a, record=None)

    def run(self, params: dict[str, Tensor], a: Tensor, record: list[Record] | None) -> Tensor:
        """The forward pass; with ``record``, every Linear map's input and output are appended
        (the recurrent map's output as its probe) for the ghost path."""
        x = a
        for layer in self.maps:
            outs = []
            for direction, (ih, hh) in enumerate(layer):
                p_ih = {k: params[ih.local_key(k)] for k in ih.param_shapes()}
                p_hh = {k: params[hh.local_key(k)] for k in hh.param_shapes()}
                z_ih = ih.forward(p_ih, x)  # (n, B, T, G H): every step's input map at once
                probe = None
                if record is not None:
                    probe = z_ih.new_zeros(z_ih.shape, requires_grad=True)
                    if not z_ih.requires_grad:  # the first layer on the model's input
                        z_ih.requires_grad_(True)
                    record.append((ih, p_ih, x.detach(), z_ih))
                # the reverse direction: the same recurrence over the reversed steps (its probe
                # and inputs in that order too: the per-sample sums over steps do not mind)
                steps_in = z_ih.flip(2) if direction else z_ih
                out, inputs = self._steps(steps_in, p_hh, probe)
                if record is not None and probe is not None:
                    record.append((hh, p_hh, inputs.detach(), probe))
                outs.append(out.flip(2) if direction else out)
            x = outs[0] if len(outs) == 1 else torch.cat(outs, -1)
        return x

    def _steps(
        self, z_ih: Tensor, p_hh: dict[str, Tensor], probe: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """The recurrence over the steps: the hidden states ``(n, B, T, H)`` and the recurrent
        map's inputs ``h_{t-1}`` (same shape). What does not depend on ``h`` is summed for all
        steps first, so that a step is one batched product and the cell's few elementwise
        operations."""
        n, b, steps, _ = z_ih.shape
        size = self.hidden_size
        h = z_ih.new_zeros((n, b, size))
        c = h
        w = p_hh["weight"].transpose(1, 2)  # (n, H, G H)
        bias = p_hh.get("bias")
        # the recurrent map's own terms: its bias and the probe (zero; read for its gradient)
        own = None if bias is None else bias[:, None, None, :].expand(z_ih.shape)
        if probe is not None:
            own = probe if own is None else own + probe
        # LSTM and RNN add the two maps' outputs whole; GRU's new gate needs W_hn h + b_hn apart
        base = z_ih if own is None or self.mode == "GRU" else z_ih + own
        outs, prev = [], []
        for t in range(steps):
            prev.append(h)
            if self.mode == "GRU":
                z_hh = torch.bmm(h, w) if own is None else torch.baddbmm(own[:, :, t], h, w)
                h = self._gru(base[:, :, t], z_hh, h)
            else:
                z = torch.baddbmm(base[:, :, t], h, w)
                if self.mode == "LSTM":
                    gates = torch.sigmoid(z)  # i, f, o (the g slice is recomputed as tanh)
                    g = torch.tanh(z[..., 2 * size : 3 * size])
                    c = torch.addcmul(gates[..., size : 2 * size] * c, gates[..., :size], g)
                    h = gates[..., 3 * size :] * torch.tanh(c)
                else:
                    h = torch.tanh(z) if self.mode == "RNN_TANH" else torch.relu(z)
            outs.append(h)
        return torch.stack(outs, 2), torch.stack(prev, 2)

    def _gru(self, zi: Tensor, zh: Tensor, h: Tensor) -> Tensor:
        """One GRU step: ``r, z = sigmoid(x_rz + h_rz)``, ``m = tanh(x_n + r * h_n)``,
        ``h' = (1 - z) m + z h``."""
        size = self.hidden_size
        rz = torch.sigmoid(zi[..., : 2 * size] + zh[..., : 2 * size])
        new = torch.tanh(torch.addcmul(zi[..., 2 * size :], rz[..., :size], zh[..., 2 * size :]))
        return torch.addcmul(new, rz[..., size:], h - new)
