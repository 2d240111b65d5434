"""Time-varying directed graphs for push-sum (PrivSGP-VR Appendix D).

The exponential graph on ranks ``0..n-1``: at iteration ``k`` every node sends one message, to
``(r + h_k) mod n`` with hop ``h_k = 2^(k mod m)`` and period ``m = (n-1).bit_length()``; the
weights are ``P^k = (I + S^{h_k}) / 2`` with ``S`` the cyclic shift (row = receiver, column =
sender). ``P^k`` is doubly stochastic, so push-sum weights stay 1 on this graph. For ``n = 2^p``
the product of ``p`` consecutive ``P^k`` is exactly ``11^T/n``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from privdl.errors import GraphError
from privdl.topology.mixing import MixingMatrix


@dataclass(frozen=True, eq=False)
class ExponentialGraph:
    """PrivSGP-VR's time-varying directed exponential graph.

    ``variant="forward"`` (default, the paper's text) uses hops ``1, 2, 4, ...``;
    ``variant="sgp"`` uses the original SGP code's list ``+1, -1, +2, -2, ...`` (deduplicated
    modulo n).
    """

    n: int
    variant: str = "forward"

    def __post_init__(self) -> None:
        if self.n < 1:
            raise GraphError(f"expo: need at least 1 node, got {self.n}")
        if self.variant not in ("forward", "sgp"):
            raise GraphError(f"expo: unknown variant {self.variant!r} (forward or sgp)")

    @property
    def name(self) -> str:
        return f"expo:{self.n}" + ("" if self.variant == "forward" else ":sgp")

    @cached_property
    def hops(self) -> tuple[int, ...]:
        """The hop list cycled through, one hop per iteration (PrivSGP-VR Appendix D)."""
        if self.n == 1:
            return (0,)
        m = (self.n - 1).bit_length()
        forward = [2**i for i in range(m)]
        if self.variant == "forward":
            return tuple(forward)
        out: list[int] = []
        for h in forward:
            for s in (h, -h):
                hm = s % self.n
                if hm != 0 and hm not in out:
                    out.append(hm)
        return tuple(out)

    @property
    def period(self) -> int:
        return len(self.hops)

    def hop(self, k: int) -> int:
        return self.hops[k % self.period]

    def mixing(self, k: int) -> MixingMatrix:
        """``P^k`` as a column-stochastic :class:`MixingMatrix` (row = receiver)."""
        n = self.n
        if n == 1:
            return MixingMatrix("expo", sp.csr_matrix(np.ones((1, 1))))
        h = self.hop(k)
        senders = np.arange(n)
        receivers = (senders + h) % n
        rows = np.concatenate([senders, receivers])
        cols = np.concatenate([senders, senders])
        data = np.full(2 * n, 0.5)
        return MixingMatrix("expo", sp.csr_matrix((data, (rows, cols)), shape=(n, n)))

    def summary(self) -> dict:
        return {
            "name": self.name,
            "n": self.n,
            "time_varying": True,
            "directed": True,
            "period": self.period,
            "hops": list(self.hops),
            "edges": self.n * (self.period if self.n > 1 else 0),
            "connected": True,
        }
