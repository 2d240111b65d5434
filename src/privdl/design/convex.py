"""Conic (SDP) solutions of the noise-design problems with open solvers (cvxpy: Clarabel, SCS).

A bound on every diagonal entry of an inverse is one linear matrix inequality per matrix: for
Sigma > 0, [[Z, I], [I, Sigma]] >= 0 holds iff Z >= Sigma^{-1} (Schur complement; Boyd &
Vandenberghe, Convex Optimization, App. A.5.5), so diag(Z) <= b bounds diag(Sigma^{-1}) and Z =
Sigma^{-1} attains it. One LMI of size 2h per colluding set:

* the edge-wise design (ours): Sigma_I = diag(s_H^2) + B_H diag(w_H) B_H^T, variables s^2, w >= 0;
* Whisper D-SGD's free covariance (arXiv 2501.14644, Section 4, the SDP of eq. (9)): any PSD
  Sigma, against the eavesdropper only (I empty). Producing such a Sigma needs a trusted dealer
  or multi-party sampling: it is a baseline, labelled so, not a mechanism privdl runs.

Small n only (the LMIs have O(n^2) entries per set): n <= 40 for the design, ~100 for Whisper's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privdl.design.objective import Problem
from privdl.errors import ConfigError

__all__ = ["solve_convex", "solve_whisper"]

SOLVERS = ("CLARABEL", "SCS")


def _cvxpy() -> Any:
    try:
        import cvxpy as cp
    except ImportError:  # pragma: no cover - an optional dependency
        raise ConfigError("the conic solver needs cvxpy: pip install cvxpy") from None
    return cp


#: Whisper's free covariance above this many nodes goes to SCS first: the interior-point
#: solver's memory grows as n^4 (Clarabel: 1.3 GB at n = 50, over 15 GB at n = 100), SCS's
#: first-order iterations take 0.4 GB at n = 100 (docs/noise-design.md).
WHISPER_IPM_LIMIT = 40
#: SCS's tolerances for Whisper's covariance: at n = 50 its objective, made feasible, was
#: 7e-6 above Clarabel's (5e-4 with SCS's default 1e-4), so the baseline is not weakened.
WHISPER_SCS = {"eps_abs": 1e-6, "eps_rel": 1e-6, "max_iters": 1_000_000}


def _solve(
    cp: Any,
    prob: Any,
    order: tuple[str, ...] = SOLVERS,
    options: dict[str, dict[str, Any]] | None = None,
) -> str:
    installed = set(cp.installed_solvers())
    last = "no solver"
    for name in order:
        if name not in installed:
            continue
        try:
            prob.solve(solver=name, **(options or {}).get(name, {}))
        except cp.error.SolverError as exc:
            last = f"{name}: {exc}".splitlines()[0]
            continue
        if prob.status in ("optimal", "optimal_inaccurate"):
            return str(name)
        last = f"{name}: {prob.status}"
    raise ConfigError(f"the conic solver failed ({last})")


def _inverse_bound(cp: Any, sigma: Any, h: int, bound: float) -> list[Any]:
    z = cp.Variable((h, h), symmetric=True)
    block = cp.bmat([[z, np.eye(h)], [np.eye(h), sigma]])
    return [0.5 * (block + block.T) >> 0, cp.diag(z) <= bound]


def solve_convex(problem: Problem) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The edge-wise design at b = 1 by one LMI per colluding set (module docstring)."""
    cp = _cvxpy()
    n, edges = problem.n, problem.edges
    m = len(edges)
    scale = float(problem.a.sum() + problem.c.sum()) or 1.0
    s = cp.Variable(n, nonneg=True)
    w = cp.Variable(m, nonneg=True)
    incidence = np.zeros((n, m))
    incidence[edges[:, 0], np.arange(m)] = 1.0
    incidence[edges[:, 1], np.arange(m)] = -1.0
    constraints = []
    for subset in problem.sets:
        keep = np.setdiff1d(np.arange(n), subset)
        inner = np.flatnonzero(np.isin(edges[:, 0], keep) & np.isin(edges[:, 1], keep))
        b_h = incidence[np.ix_(keep, inner)]
        sigma = (
            cp.diag(s[keep]) + b_h @ cp.diag(w[inner]) @ b_h.T if len(inner) else cp.diag(s[keep])
        )
        constraints += _inverse_bound(cp, sigma, len(keep), 1.0)
    prob = cp.Problem(cp.Minimize((problem.a @ s + problem.c @ w) / scale), constraints)
    solver = _solve(cp, prob)
    node = np.maximum(np.asarray(s.value, dtype=np.float64), 0.0)
    edge = np.maximum(np.asarray(w.value, dtype=np.float64), 0.0)
    return node, edge, {"solver": solver, "objective": float(prob.value) * scale}


def solve_whisper(residual: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """Whisper's free covariance at b = 1: min tr(M Sigma) over PSD Sigma with
    diag(Sigma^{-1}) <= 1 (eavesdropper only; one LMI). Clarabel up to
    :data:`WHISPER_IPM_LIMIT` nodes, SCS above. Returns Sigma and the solver facts."""
    cp = _cvxpy()
    n = residual.shape[0]
    scale = float(np.trace(residual)) or 1.0
    sigma = cp.Variable((n, n), PSD=True)
    prob = cp.Problem(
        cp.Minimize(cp.trace(residual @ sigma) / scale), _inverse_bound(cp, sigma, n, 1.0)
    )
    order = SOLVERS if n <= WHISPER_IPM_LIMIT else ("SCS", "CLARABEL")
    solver = _solve(cp, prob, order, {"SCS": WHISPER_SCS})
    value = np.asarray(sigma.value, dtype=np.float64)
    value = 0.5 * (value + value.T)
    return value, {"solver": solver, "objective": float(prob.value) * scale}
