"""D-SGD, and D-SGD with clipping and per-node Gaussian noise (DECOR's LDP baseline).

One iteration for all nodes at once (DECOR Algorithm 1 with ``sigma_cor = 0``, matrix form
Algorithm 4):

    g_i     = Clip(grad l(x_i, xi_i); C)                        (Alg. 1 line 2)
    gt_i    = g_i + vbar_i,   vbar_i ~ N(0, sigma^2 I)          (eq. 3 without correlated noise)
    x_i^1/2 = (1 - eta_t wd) x_i - eta_t gt_i                    (line 5; weight decay outside the clip)
    x_i^+   = sum_j W_ij x_j^1/2                                 (eq. 4, gossip)

With ``sigma = 0`` and no clipping this is plain D-SGD. The noise ``vbar_i`` at step ``t`` is a
function of node ``i``'s stream key and ``t`` only, so runs are reproducible, resumable and
independent of how nodes are sharded over processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from privdl.algorithms.base import StepSize, in_background
from privdl.comm.base import Communicator, Tree
from privdl.engine.grads import ClipSpec
from privdl.errors import ConfigError


def gaussian_tree(
    keys: tuple[bytes, ...],
    counter: int,
    like: Tree,
    *,
    sigma: float,
    backend: str = "auto",
    prefetch: bool = False,
) -> Tree:
    """Per-node Gaussian noise ``N(0, sigma^2)`` shaped like ``like`` (stream row i = node i).

    ``prefetch``: as in :func:`privdl.mechanisms.correlated.independent_noise` (leaves are then
    views into a cached block of iterations; use them out of place).
    """
    from privdl.mechanisms.correlated import independent_noise

    first = next(iter(like.values()))
    size = sum(v[0].numel() for v in like.values())
    flat = independent_noise(
        keys,
        counter,
        size,
        sigma=sigma,
        dtype=first.dtype,
        device=first.device,
        backend=backend,
        prefetch=prefetch,
    )
    return unflatten(flat, like)


def unflatten(flat: torch.Tensor, like: Tree) -> Tree:
    """Split ``(n, P)`` into a tree shaped like ``like`` (leaves ``(n, ...)``)."""
    out, start = {}, 0
    for name, v in like.items():
        size = v[0].numel()
        out[name] = flat[:, start : start + size].reshape(v.shape)
        start += size
    return out


@dataclass
class DSGDState:
    """Explicit state: the stacked parameters and the step counter (noise keys are static)."""

    params: Tree
    t: int = 0
    noise_keys: tuple[bytes, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class DSGD:
    """D-SGD with optional clipping and per-node Gaussian noise of std ``sigma``."""

    step_size: StepSize
    clip: ClipSpec = ClipSpec()
    sigma: float = 0.0
    weight_decay: float = 0.0
    noise_backend: str = "auto"  # keyed Gaussian streams: privdl.mechanisms.prng.resolve_backend

    def __post_init__(self) -> None:
        if self.sigma < 0:
            raise ConfigError(f"sigma must be >= 0, got {self.sigma}")
        if self.weight_decay < 0:
            raise ConfigError(f"weight decay must be >= 0, got {self.weight_decay}")

    def init(self, params: Tree, *, seed: int) -> DSGDState:
        from privdl.mechanisms.secrets import node_noise_keys

        n = next(iter(params.values())).shape[0]
        keys = tuple(node_noise_keys(range(n), seed=seed)) if self.sigma > 0 else ()
        return DSGDState(params=params, t=0, noise_keys=keys)

    def step(self, state: DSGDState, oracle, comm: Communicator) -> tuple[DSGDState, dict]:
        """One iteration; ``oracle(params, t, clip=...)`` returns the engine's ``GradResult``."""
        t = state.t
        eta = self.step_size(t)
        pending = None
        if self.sigma > 0:  # the noise does not depend on the gradients: draw it meanwhile
            keys = tuple(state.noise_keys[i] for i in comm.owned_list)
            like = state.params
            pending = in_background(
                lambda: gaussian_tree(
                    keys, t, like, sigma=self.sigma, backend=self.noise_backend, prefetch=True
                ),
                device=next(iter(like.values())).device,
            )
        res = oracle(state.params, t, clip=self.clip)
        update = res.grads
        if pending is not None:
            noise = pending()
            added = torch._foreach_add(list(update.values()), [noise[k] for k in update])
            update = dict(zip(update, added, strict=True))  # one launch on CUDA
        decay = 1.0 - eta * self.weight_decay
        half = {k: decay * state.params[k] - eta * update[k] for k in update}
        new = comm.mix(half, t)
        return replace(state, params=new, t=t + 1), {"loss": res.loss}
