"""Per-client noise and privacy of heterogeneous-DP federated learning (Robust-HDP, ICML 2024).

Each client ``i`` runs ``E_i = K ceil(N_i/b_i)`` local DP-SGD steps a round with Poisson sampling
at rate ``q_i = b_i/N_i`` (Algorithm 1, Eq. 1) and must meet its own ``eps_i`` over all rounds.
:func:`client_noise_multipliers` finds each ``z_i``; :class:`ClientAccountant` certifies what each
client has spent after the rounds it took part in. The threat model is the server, which sees
every client's update; the unit is one example, neighbouring add/remove (Poisson sampling).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from privdl.accounting.budget import PrivacyBudget
from privdl.accounting.dpsgd import (
    calibrate_noise_multipliers,
    epsilons_from_curves,
    poisson_rdp_curves,
)
from privdl.accounting.nominal import robust_hdp_noise_multipliers

__all__ = ["ClientAccountant", "client_noise_multipliers", "server_budget"]


def server_budget(
    epsilon: float, delta: float, *, accountant: str = "rdp", nominal: bool = False, notes: str = ""
) -> dict[str, Any]:
    """A client's labelled (eps, delta): example-level, add/remove (Poisson sampling), against
    the server that sees its updates (Robust-HDP's threat model)."""
    return PrivacyBudget(
        epsilon=epsilon,
        delta=delta,
        accountant=accountant,
        neighbouring="add_remove",
        unit="example",
        threat_model="server",
        nominal=nominal,
        notes=notes,
    ).to_dict()


@functools.lru_cache(maxsize=4096)
def _reference_noise_multiplier(
    eps: float,
    batch_size: float,
    num_samples: int,
    local_epochs: int,
    rounds: int,
    delta: float,
    decimals: int | None,
) -> float:
    """One client's ``z_i`` from the reference accountant (a bisection; cached: experiments
    build many trainers with the same clients)."""
    return float(
        robust_hdp_noise_multipliers(
            [eps],
            [batch_size],
            num_samples=num_samples,
            local_epochs=local_epochs,
            rounds=rounds,
            delta=delta,
            decimals=decimals,
        )[0]
    )


def client_noise_multipliers(
    epsilons: np.ndarray,
    *,
    batch_sizes: np.ndarray,
    num_samples: np.ndarray,
    local_steps: np.ndarray,
    local_epochs: int,
    rounds: int,
    delta: float,
    calibration: Literal["rdp", "reference"] = "rdp",
    z_decimals: int | None = 2,
) -> np.ndarray:
    """Each client's noise multiplier ``z_i`` for its ``eps_i`` over ``rounds`` rounds.

    ``"rdp"``: the smallest ``z_i`` dp-accounting's RDP accountant certifies (all clients in one
    vectorised bisection). ``"reference"``: the Robust-HDP code's accountant (classic RDP
    conversion, its bisection, ``z_decimals`` rounding), whose ``eps_i`` is NOMINAL.
    """
    b, counts = np.asarray(batch_sizes, float), np.asarray(num_samples)
    if calibration == "rdp":
        return calibrate_noise_multipliers(
            target_epsilons=epsilons,
            sampling_rates=b / counts,
            steps=local_steps * rounds,
            delta=delta,
        )
    return np.array(
        [
            _reference_noise_multiplier(
                float(e), float(bb), int(m), local_epochs, rounds, delta, z_decimals
            )
            for e, bb, m in zip(epsilons, b, counts, strict=True)
        ]
    )  # setup only: one (cached) bisection per distinct client


class ClientAccountant:
    """What each client has spent: dp-accounting's RDP accountant over the rounds it joined.

    ``targets``: the epsilons the noise was calibrated to; ``reported``: what each client told the
    server; ``calibration="reference"`` also labels each target as the nominal budget the
    reference code's accountant claims for its ``z_i``.
    """

    def __init__(
        self,
        *,
        noise_multipliers: np.ndarray,
        batch_sizes: np.ndarray,
        num_samples: np.ndarray,
        local_steps: np.ndarray,
        rounds: int,
        delta: float,
        targets: np.ndarray,
        reported: np.ndarray,
        calibration: str = "rdp",
    ) -> None:
        self.z = np.asarray(noise_multipliers, float)
        self.b = np.asarray(batch_sizes, float)
        self.m = np.asarray(num_samples)
        self.local_steps = np.asarray(local_steps)
        self.rounds, self.delta = int(rounds), float(delta)
        self.targets, self.reported = np.asarray(targets, float), np.asarray(reported, float)
        self.calibration = calibration
        self._curves: np.ndarray | None = None

    def budgets(self, participated: Sequence[int] | np.ndarray | None = None) -> list[dict]:
        """Every client's entry: ``noise_multiplier``, ``target_epsilon``, ``reported_epsilon``,
        ``nominal`` (the reference code's claim, or None) and ``accounted`` (the certified
        (eps, delta) after ``participated`` rounds, default all; None before its first round)."""
        n = len(self.z)
        rounds = np.full(n, self.rounds) if participated is None else np.asarray(participated)
        if self._curves is None:  # one step's RDP of every client, computed once
            self._curves = poisson_rdp_curves(self.b / self.m, self.z)
        spent_steps = rounds * self.local_steps
        eps = epsilons_from_curves(self._curves, spent_steps, self.delta)
        out = []
        for i in range(n):  # reporting only, not a hot path
            z, q = float(self.z[i]), self.b[i] / self.m[i]
            steps = int(spent_steps[i])
            accounted = (
                server_budget(
                    float(eps[i]),
                    self.delta,
                    notes=f"poisson sampling q={q:.6g}, z={z:.6g}, T={steps}; RDP curve by "
                    "privdl's series (dp-accounting's to 1e-9), dp-accounting's conversion",
                )
                if steps > 0
                else None
            )
            target = None
            if self.calibration == "reference":
                target = server_budget(
                    float(self.targets[i]),
                    self.delta,
                    accountant="nominal:robust-hdp-code",
                    nominal=True,
                    notes=f"z={z} from the reference accountant, T=K E N/b, rounded",
                )
            out.append(
                {
                    "client": i,
                    "noise_multiplier": z,
                    "target_epsilon": float(self.targets[i]),
                    "reported_epsilon": float(self.reported[i]),
                    "nominal": target,
                    "accounted": accounted,
                }
            )
        return out
