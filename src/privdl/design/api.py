"""Design DECOR's noise for a target (epsilon, delta) and certify it (docs/noise-design.md).

1. The target is turned into the per-step SecRDP slope by the inversion ``privdl calibrate decor``
   uses (:func:`privdl.accounting.conversion.step_rdp_for_epsilon`), then into the bound
   b = eps_step / (2 C^2) on every [Sigma_I^{-1}]_ii.
2. The design problem (:mod:`privdl.design.objective`) is solved by the conic solver for small n
   or the first-order solver for large n, started from (and never worse than) DECOR's best scalar
   pair for the same objective.
3. The accountant (:func:`privdl.accounting.design.account_design`) certifies the result; if its
   epsilon exceeds the target by rounding, every variance is scaled up until it does not. The
   certificate is the accountant's evaluation, never the optimizer's constraint values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privdl.accounting.conversion import DEFAULT_CONVERSION, step_rdp_for_epsilon
from privdl.accounting.decor import DecorAccount
from privdl.accounting.design import account_design
from privdl.design.first_order import ConstraintOracle, solve_first_order
from privdl.design.objective import Problem, best_scalar, make_problem, residual_matrix
from privdl.errors import PrivacyError
from privdl.mechanisms.dealer import DealerCovariance
from privdl.mechanisms.noise_design import NoiseDesign
from privdl.topology.graphs import Topology
from privdl.topology.mixing import mixing_matrix

__all__ = ["CONVEX_LIMIT", "DesignResult", "design_noise", "optimize_design"]

#: ``solver="auto"`` uses the conic solver up to this many nodes (eavesdropper and curious users),
#: the first-order one above and for q >= 2 colluders.
CONVEX_LIMIT = 40
#: Whisper's free covariance is computed (cvxpy) up to this many nodes.
WHISPER_LIMIT = 100
WHISPER_LABEL = "Whisper free covariance (needs a trusted dealer; eavesdropper only)"


@dataclass(frozen=True)
class DesignResult:
    """A certified design and the residual noise of it and of the baselines at the same target."""

    design: NoiseDesign
    account: DecorAccount  # the accountant's certificate for ``design``
    horizon: int
    mixing: str
    residual: float  # tr(M Sigma) of the design
    residual_decor: float  # DECOR's best scalar pair, same objective, same b
    decor_sigmas: tuple[float, float]  # that pair's (sigma_cdp, sigma_cor)
    residual_ldp: float  # independent noise only (sigma_cor = 0)
    residual_cdp: float  # a trusted curator's noise on the average (reference)
    bound: float  # b = eps_step / (2 C^2)
    solver: dict[str, Any] = field(default_factory=dict)
    residual_whisper: float | None = None
    #: Whisper's free covariance at the same target, certified by the dealer's accountant
    #: (:func:`privdl.accounting.design.dealer_step_rdp`; needs a trusted dealer)
    whisper: DealerCovariance | None = None
    whisper_account: DecorAccount | None = None

    @property
    def residual_ratio_vs_decor(self) -> float:
        """The design's residual noise over DECOR's best scalar pair's (same objective)."""
        return self.residual / self.residual_decor

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (``privdl design-noise --json``)."""
        budget = self.account.budget
        edge = self.design.edge_var
        return {
            "n": self.design.n,
            "edges": len(edge),
            "adversary": self.account.adversary,
            "horizon": self.horizon,
            "mixing": self.mixing,
            "residual_ratio_vs_decor": self.residual_ratio_vs_decor,
            "residual": {
                "design": self.residual,
                "decor_scalar": self.residual_decor,
                "ldp": self.residual_ldp,
                "cdp": self.residual_cdp,
                "whisper": self.residual_whisper,
            },
            "residual_labels": {
                "cdp": "trusted curator's noise on the average (reference, not decentralized)",
                "whisper": WHISPER_LABEL,
            },
            "decor_scalar": {"sigma_cdp": self.decor_sigmas[0], "sigma_cor": self.decor_sigmas[1]},
            "epsilon_accounted": budget.epsilon,
            "whisper_epsilon_label": (
                None if self.whisper_account is None else self.whisper_account.budget.label()
            ),
            "epsilon_label": budget.label(),
            "budget": budget.to_dict(),
            "step_rdp": self.account.step_rdp,
            "bound": self.bound,
            "edge_var": _summary(edge),
            "node_var": _summary(self.design.node_var),
            "solver": self.solver,
        }


def _summary(values: np.ndarray) -> dict[str, float]:
    if not len(values):
        return {"min": 0.0, "median": 0.0, "mean": 0.0, "max": 0.0, "zeros": 0}
    return {
        "min": float(values.min()),
        "median": float(np.median(values)),
        "mean": float(values.mean()),
        "max": float(values.max()),
        "zeros": int(np.sum(values == 0)),
    }


def optimize_design(
    topology: Topology,
    problem: Problem,
    *,
    solver: str = "auto",
    max_seconds: float | None = None,
) -> tuple[np.ndarray, np.ndarray, float, tuple[float, float], dict[str, Any]]:
    """The design at b = 1: ``(s^2, w, objective, (s^2, c^2) of DECOR's best pair, facts)``.

    Never worse than DECOR's best scalar pair (a feasible start); every point returned is scaled
    so that its largest [Sigma_I^{-1}]_ii is 1 as evaluated here (the accountant certifies it)."""
    if solver not in ("auto", "cvxpy", "first-order"):
        raise PrivacyError(f"unknown solver {solver!r}; use auto, cvxpy or first-order")
    started = time.perf_counter()
    s2, c2, scalar_value = best_scalar(topology, problem)
    m = len(problem.edges)
    start = (np.full(problem.n, s2), np.full(m, c2))
    # q >= 2 colluders: one LMI per colluding set makes the conic solver the slow one (n = 20,
    # collusion:2: 86 s CPU against 15 s first-order, the same objective to 2e-7; docs)
    colluders = problem.sets.shape[1] >= 2
    use_cvx = solver == "cvxpy" or (
        solver == "auto" and problem.n <= CONVEX_LIMIT and not colluders
    )
    facts: dict[str, Any] = {"scalar_seconds": time.perf_counter() - started}
    if use_cvx:
        from privdl.design.convex import solve_convex

        node, edge, info = solve_convex(problem)
        facts.update(info, method="cvxpy")
    else:
        node, edge, info = solve_first_order(problem, start, max_seconds=max_seconds)
        facts.update(info, method="first-order (augmented Lagrangian, L-BFGS-B)")
    oracle = ConstraintOracle.of(problem)
    fmax = float(oracle.values(oracle.inverses(node, edge)).max())
    node, edge = node * fmax, edge * fmax
    value = problem.objective(node, edge)
    if not value < scalar_value:
        node, edge, value = start[0], start[1], scalar_value
        facts["kept_scalar"] = True
    facts["seconds"] = time.perf_counter() - started
    return node, edge, value, (s2, c2), facts


def design_noise(
    topology: Topology,
    *,
    epsilon: float,
    delta: float,
    steps: int,
    clip: float = 1.0,
    adversary: str = "eavesdropper",
    mixing: str = "metropolis",
    horizon: int = 10,
    solver: str = "auto",
    whisper: bool = False,
    max_seconds: float | None = None,
    conversion: str = DEFAULT_CONVERSION,
) -> DesignResult:
    """A noise design for DECOR on ``topology`` at user-level (epsilon, delta)-SecLDP over
    ``steps`` steps against ``adversary``, minimizing the residual noise after ``horizon`` gossip
    steps with the ``mixing`` rule; certified by the accountant (module docstring)."""
    if not clip > 0:
        raise PrivacyError(f"clip must be > 0, got {clip}")
    rho = step_rdp_for_epsilon(epsilon, steps=steps, delta=delta, conversion=conversion)
    bound = rho / (2.0 * clip**2)
    w_mix = mixing_matrix(topology, mixing).dense()
    problem = make_problem(topology, w_mix, horizon=horizon, adversary=adversary)
    node, edge, value, (s2, c2), facts = optimize_design(
        topology, problem, solver=solver, max_seconds=max_seconds
    )
    meta = {
        "kind": "optimized",
        "adversary": problem.adversary,
        "epsilon": epsilon,
        "delta": delta,
        "steps": steps,
        "clip": clip,
        "horizon": horizon,
        "mixing": mixing,
        "solver": facts.get("method"),
    }
    design = NoiseDesign(node / bound, edge / bound, topology.edges, meta)
    design, account = _certified(
        design, lambda d: account_design(
            topology, d, clip=clip, steps=steps, delta=delta, adversary=problem.adversary,
            conversion=conversion,
        ), epsilon, rho,
    )  # fmt: skip
    m_res = residual_matrix(w_mix, horizon)
    ones = np.ones(topology.n)
    residual_whisper = None
    whisper_cov, whisper_account = None, None
    if whisper:
        if problem.adversary != "eavesdropper" or topology.n > WHISPER_LIMIT:
            raise PrivacyError(
                f"{WHISPER_LABEL}: only for the eavesdropper and n <= {WHISPER_LIMIT}"
            )
        from privdl.design.convex import solve_whisper

        sigma_w, whisper_facts = solve_whisper(m_res)
        fmax = float(np.max(np.diag(np.linalg.inv(sigma_w))))
        whisper_meta = {**meta, "kind": "whisper-free-covariance", "adversary": "eavesdropper"}
        whisper_meta["solver"] = whisper_facts["solver"]
        whisper_cov = DealerCovariance(sigma_w * (fmax / bound), whisper_meta)
        whisper_cov, whisper_account = _certified(
            whisper_cov, lambda d: account_design(
                topology, d, clip=clip, steps=steps, delta=delta, conversion=conversion
            ), epsilon, rho,
        )  # fmt: skip
        residual_whisper = float(np.trace(m_res @ whisper_cov.covariance))
    return DesignResult(
        design=design,
        account=account,
        horizon=horizon,
        mixing=mixing,
        residual=problem.objective(design.node_var, design.edge_var),
        residual_decor=value_of_scalar(problem, s2, c2) / bound,
        decor_sigmas=(float(np.sqrt(s2 / bound)), float(np.sqrt(c2 / bound))),
        residual_ldp=float(problem.a.sum()) / bound,
        residual_cdp=float(ones @ m_res @ ones) / (topology.n**2 * bound),
        bound=bound,
        solver=facts,
        residual_whisper=residual_whisper,
        whisper=whisper_cov,
        whisper_account=whisper_account,
    )


def _certified(design: Any, account_of: Any, epsilon: float, rho: float) -> tuple[Any, Any]:
    """``design`` and the accountant's certificate, every variance scaled up while rounding
    puts the accounted epsilon above the target (epsilon falls as the noise grows)."""
    account = account_of(design)
    for _ in range(8):
        if account.epsilon <= epsilon:
            break
        design = design.scaled(account.step_rdp / rho * (1.0 + 1e-12))
        account = account_of(design)
    if account.epsilon > epsilon:  # pragma: no cover - the scaling above always lands
        raise PrivacyError(f"the design could not be certified at epsilon = {epsilon}")
    return design, account


def value_of_scalar(problem: Problem, s2: float, c2: float) -> float:
    """tr(M Sigma) of DECOR's scalar pair (s^2, c^2)."""
    return s2 * float(problem.a.sum()) + c2 * float(problem.c.sum())
