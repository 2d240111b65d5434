"""D-SGD, and D-SGD with clipping and per-node Gaussian noise (DECOR's LDP and CDP baselines).

One iteration for all nodes at once (DECOR Algorithm 1 with ``sigma_cor = 0``, matrix form
Algorithm 4):

    g_i     = Clip(grad l(x_i, xi_i); C)                        (Alg. 1 line 2)
    gt_i    = g_i + vbar_i,   vbar_i ~ N(0, sigma^2 I)          (eq. 3 without correlated noise)
    x_i^1/2 = (1 - eta_t wd) x_i - eta_t gt_i                    (line 5; weight decay outside the clip)
    x_i^+   = sum_j W_ij x_j^1/2                                 (eq. 4, gossip)

This is :class:`~privdl.algorithms.decor.Decor` without correlated noise, so it is made by it:
one implementation of the step, whatever noise a run adds. With ``sigma = 0`` and no clipping it
is plain D-SGD. The noise ``vbar_i`` at step ``t`` is a function of node ``i``'s stream key and
``t`` only, so runs are reproducible, resumable and independent of how nodes are sharded over
processes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privdl.algorithms.base import StepSize
from privdl.algorithms.decor import Decor, DecorState
from privdl.engine.grads import ClipSpec
from privdl.mechanisms.prng import NormalBackend

__all__ = ["DSGD", "DSGDState"]

#: The state of D-SGD (DECOR's, with no edge secrets).
DSGDState = DecorState
_NO_EDGES = np.zeros((0, 2), dtype=np.int64)


def DSGD(  # noqa: N802 - named as the algorithm it makes
    step_size: StepSize,
    *,
    clip: ClipSpec = ClipSpec(),
    sigma: float = 0.0,
    weight_decay: float = 0.0,
    noise_backend: NormalBackend = "auto",
    optimizer: Any = None,
) -> Decor:
    """D-SGD with optional clipping, per-node Gaussian noise of std ``sigma`` and an optimizer
    (:mod:`privdl.optim`) applied per node to the privatized gradient."""
    return Decor(
        step_size,
        edges=_NO_EDGES,
        n_nodes=0,  # no correlated noise: the edges are never needed
        clip=clip,
        sigma_cdp=sigma,
        sigma_cor=0.0,
        weight_decay=weight_decay,
        noise_backend=noise_backend,
        optimizer=optimizer,
    )
