"""Per-client noise and privacy of heterogeneous-DP federated learning (Robust-HDP, ICML 2024).

Each client ``i`` runs ``E_i = K ceil(N_i/b_i)`` local DP-SGD steps a round with Poisson sampling
at rate ``q_i = b_i/N_i`` (Algorithm 1, Eq. 1) and must meet its own ``eps_i`` over all rounds.
:func:`client_noise_multipliers` finds each ``z_i``; :class:`ClientAccountant` certifies what each
client has spent after the rounds it took part in. The threat model is the server, which sees
every client's update; the unit is one example, neighbouring add/remove (Poisson sampling).

Accountants (the run's ``accountant``):

* ``"tightest"`` (the default, as everywhere in privdl): the smaller certified epsilon of
  dp-accounting's PLD (pessimistic discretisation, with privdl's FFT round-off guard) and its RDP
  (:func:`privdl.accounting.tightest.tightest_epsilon`), labelled with the accountant that won
  (``pld``, or ``rdp`` where PLD lost, could not be computed or was refused by its round-off
  guard; the notes say which and give the other beside it). Calibration inverts the same
  accountant (:func:`~privdl.accounting.tightest.calibrate_tightest`), once per distinct
  ``(q, T, eps, delta)``; accounting is cached per distinct ``(q, z, T, delta)``, so many clients
  with a few distinct settings cost a few PLD compositions. A :class:`ClientAccountant` also
  keeps each distinct client's single step (:class:`~privdl.accounting.rdp_pld.PoissonStepCache`),
  so a metrics row after more rounds self-composes it instead of building it again (the same
  numbers).
* ``"rdp"``: dp-accounting's RDP accountant alone, vectorised over clients (privdl 0.1's numbers,
  and what saved runs without the ``accountant`` field resume with).
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
from privdl.accounting.events import SubsampledGaussianEvent
from privdl.accounting.nominal import robust_hdp_noise_multipliers
from privdl.accounting.rdp_pld import PoissonStepCache
from privdl.accounting.tightest import TIGHTEST, Accounted, calibrate_tightest, tightest_epsilon
from privdl.errors import PrivacyError

__all__ = [
    "CLIENT_ACCOUNTANTS",
    "CLIENT_CALIBRATIONS",
    "ClientAccountant",
    "client_noise_multipliers",
    "server_budget",
]

#: How a client's spent budget is accounted: the tightest certified (default) or RDP alone.
CLIENT_ACCOUNTANTS = (TIGHTEST, "rdp")
#: How a client's ``z_i`` is found: by an accountant of :data:`CLIENT_ACCOUNTANTS`, or by the
#: Robust-HDP code's accountant (``"reference"``: nominal).
CLIENT_CALIBRATIONS = (TIGHTEST, "rdp", "reference")


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


def _client_event(q: float, z: float, steps: int) -> SubsampledGaussianEvent:
    """``steps`` local DP-SGD steps of one client: Poisson rate ``q``, add/remove (Eq. 1)."""
    return SubsampledGaussianEvent(
        noise_multiplier=float(z),
        sampling_rate=float(q),
        steps=int(steps),
        sampling="poisson",
        neighbouring="add_remove",
    )


@functools.lru_cache(maxsize=4096)
def _tightest_spent(q: float, z: float, steps: int, delta: float) -> Accounted:
    """The tightest certified epsilon of one client setting (cached: every evaluation row asks
    again with the rounds each client joined, and clients repeat settings)."""
    return tightest_epsilon(_client_event(q, z, steps), delta=delta)


@functools.lru_cache(maxsize=4096)
def _tightest_noise_multiplier(eps: float, q: float, steps: int, delta: float) -> float:
    """Smallest ``z`` whose tightest certified epsilon over ``steps`` steps is <= ``eps``.

    :func:`~privdl.accounting.tightest.calibrate_tightest`, checked by the accountant that will
    account the client (:func:`_tightest_spent`); where the PLD search fails (its FFT round-off
    guard refuses, or the check does not hold) RDP's own calibration is used, which the tightest
    accountant certifies too (it is never above RDP). Cached per distinct setting."""
    try:
        z = calibrate_tightest(target_epsilon=eps, event=_client_event(q, 1.0, steps), delta=delta)
        if _tightest_spent(q, z, steps, delta).epsilon <= eps:
            return float(z)
    except PrivacyError:
        pass
    z = float(
        calibrate_noise_multipliers(
            target_epsilons=[eps], sampling_rates=[q], steps=[steps], delta=delta
        )[0]
    )
    if _tightest_spent(q, z, steps, delta).epsilon > eps:  # pragma: no cover - min(pld, rdp)
        raise PrivacyError(f"no certified noise multiplier found for epsilon {eps}")
    return z


def client_noise_multipliers(
    epsilons: np.ndarray,
    *,
    batch_sizes: np.ndarray,
    num_samples: np.ndarray,
    local_steps: np.ndarray,
    local_epochs: int,
    rounds: int,
    delta: float,
    calibration: Literal["tightest", "rdp", "reference"] = "tightest",
    z_decimals: int | None = 2,
) -> np.ndarray:
    """Each client's noise multiplier ``z_i`` for its ``eps_i`` over ``rounds`` rounds
    (Robust-HDP Algorithm 1, Eq. 1: ``E_i * rounds`` Poisson-sampled steps at ``q_i = b_i/N_i``).

    ``"tightest"`` (default): the smallest ``z_i`` (to relative 1e-4, on the safe side) whose
    tightest certified epsilon (the smaller of dp-accounting's PLD and RDP) is at most ``eps_i``;
    one calibration per distinct ``(q_i, T_i, eps_i, delta)``, shared by the clients that have it
    (and cached across calls). ``"rdp"``: the smallest ``z_i`` dp-accounting's RDP accountant
    certifies (all clients in one vectorised bisection). ``"reference"``: the Robust-HDP code's
    accountant (classic RDP conversion, its bisection, ``z_decimals`` rounding), whose ``eps_i``
    is NOMINAL.
    """
    b, counts = np.asarray(batch_sizes, float), np.asarray(num_samples)
    if calibration not in CLIENT_CALIBRATIONS:
        raise PrivacyError(f"calibration must be one of {CLIENT_CALIBRATIONS}, got {calibration!r}")
    if calibration == "rdp":
        return calibrate_noise_multipliers(
            target_epsilons=epsilons,
            sampling_rates=b / counts,
            steps=local_steps * rounds,
            delta=delta,
        )
    if calibration == TIGHTEST:
        eps = np.asarray(epsilons, float)
        q, steps = b / counts, np.asarray(local_steps, np.int64) * int(rounds)
        if len(eps) != len(q) or np.any(~(eps > 0)) or np.any(steps < 1):
            raise PrivacyError("need one positive target epsilon and step count per client")
        keys = [(float(e), float(qq), int(t)) for e, qq, t in zip(eps, q, steps, strict=True)]
        z_of = {k: _tightest_noise_multiplier(*k, float(delta)) for k in dict.fromkeys(keys)}
        return np.array([z_of[k] for k in keys], float)  # one calibration per distinct setting
    return np.array(
        [
            _reference_noise_multiplier(
                float(e), float(bb), int(m), local_epochs, rounds, delta, z_decimals
            )
            for e, bb, m in zip(epsilons, b, counts, strict=True)
        ]
    )  # setup only: one (cached) bisection per distinct client


class ClientAccountant:
    """What each client has spent after the rounds it joined, by ``accountant``: ``"tightest"``
    (default: the smaller of dp-accounting's PLD and RDP, one composition per distinct
    ``(q_i, z_i, T_i)``, cached) or ``"rdp"`` (dp-accounting's RDP, vectorised over clients).

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
        calibration: str = TIGHTEST,
        accountant: str = TIGHTEST,
    ) -> None:
        if accountant not in CLIENT_ACCOUNTANTS:
            raise PrivacyError(
                f"accountant must be one of {CLIENT_ACCOUNTANTS}, got {accountant!r}"
            )
        self.z = np.asarray(noise_multipliers, float)
        self.b = np.asarray(batch_sizes, float)
        self.m = np.asarray(num_samples)
        self.local_steps = np.asarray(local_steps)
        self.rounds, self.delta = int(rounds), float(delta)
        self.targets, self.reported = np.asarray(targets, float), np.asarray(reported, float)
        self.calibration = calibration
        self.accountant = accountant
        self._curves: np.ndarray | None = None
        #: each distinct client's single step (PLD and RDP), composed per row
        self.steps_cache = PoissonStepCache()
        self._spent: dict[tuple[float, float, int], Accounted] = {}

    def _rdp(self, spent_steps: np.ndarray) -> list[tuple[float, str, str]]:
        """privdl 0.1's accounting: (epsilon, label, notes) of every client by RDP."""
        if self._curves is None:  # one step's RDP of every client, computed once
            self._curves = poisson_rdp_curves(self.b / self.m, self.z)
        eps = epsilons_from_curves(self._curves, spent_steps, self.delta)
        note = "RDP curve by privdl's series (dp-accounting's to 1e-9), dp-accounting's conversion"
        return [(float(e), "rdp", note) for e in eps]

    def _tightest(self, spent_steps: np.ndarray) -> list[tuple[float, str, str]]:
        """(epsilon, label, notes) of every client by the tightest certified accountant: one
        PLD and RDP composition per distinct ``(q_i, z_i, T_i)`` (kept), of the single step of
        each distinct ``(q_i, z_i)`` (built once, :attr:`steps_cache`)."""
        out = []
        for i, steps in enumerate(spent_steps):  # cheap: the work is in the cached accountant
            if steps <= 0:
                out.append((0.0, TIGHTEST, ""))
                continue
            key = (float(self.b[i] / self.m[i]), float(self.z[i]), int(steps))
            if key not in self._spent and steps == self.rounds * self.local_steps[i]:
                # all rounds: what calibration checked (module cache), no step needed
                self._spent[key] = _tightest_spent(*key, self.delta)
            if key not in self._spent:
                self._spent[key] = tightest_epsilon(
                    _client_event(*key), delta=self.delta, steps_cache=self.steps_cache
                )
            got = self._spent[key]
            out.append((got.epsilon, got.accountant, got.notes))
        return out

    def spent(self, participated: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """Every client's certified epsilon after ``participated`` rounds (default all)."""
        return np.array([e for e, _, _ in self._account(participated)[1]], float)

    def _account(
        self, participated: Sequence[int] | np.ndarray | None
    ) -> tuple[np.ndarray, list[tuple[float, str, str]]]:
        n = len(self.z)
        rounds = np.full(n, self.rounds) if participated is None else np.asarray(participated)
        spent_steps = np.asarray(rounds * self.local_steps, np.int64)
        if self.accountant == "rdp":
            return spent_steps, self._rdp(spent_steps)
        return spent_steps, self._tightest(spent_steps)

    def budgets(self, participated: Sequence[int] | np.ndarray | None = None) -> list[dict]:
        """Every client's entry: ``noise_multiplier``, ``target_epsilon``, ``reported_epsilon``,
        ``nominal`` (the reference code's claim, or None) and ``accounted`` (the certified
        (eps, delta) after ``participated`` rounds, default all; None before its first round),
        labelled with the accountant that produced it."""
        spent_steps, accounted_all = self._account(participated)
        out = []
        for i, (eps, label, how) in enumerate(accounted_all):  # reporting only, not a hot path
            z, q = float(self.z[i]), self.b[i] / self.m[i]
            steps = int(spent_steps[i])
            accounted = (
                server_budget(
                    eps,
                    self.delta,
                    accountant=label,
                    notes=f"poisson sampling q={q:.6g}, z={z:.6g}, T={steps}; {how}",
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
