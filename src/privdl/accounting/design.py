"""SecRDP accountant for an edge-wise noise design (docs/noise-design.md, docs/accounting.md).

DECOR's accountant (Allouah et al., ICML 2024, Algorithms 2 and 3, Lemma 4;
:mod:`privdl.accounting.secrdp`) with a variance per node and per edge: for colluders I and the
honest rest H, the colluders see the honest nodes' noise with covariance (per coordinate)

    Sigma_I = diag(s_H^2) + L_H(w),     L_H(w) = weighted Laplacian of the induced subgraph G[H]

(the edges to colluders are known to them and drop out, exactly as in eq. 18), so replacing one
honest user's clipped gradient (shift <= 2C) gives the per-step slope

    eps_step = 2 C^2 max_{|I| = q} max_{i in H} [Sigma_I^{-1}]_ii.

``eavesdropper`` is q = 0, ``curious`` q = 1 (every vertex deleted in turn), ``collusion:Q`` any
q, ``ldp`` max_i 1/s_i^2. Uniform designs are DECOR's scalar noise and ``method="auto"`` hands
them to :func:`privdl.accounting.secrdp.decor_step_rdp` (the same number).

Every diagonal is computed by grounding, which stays exact (to rounding) when w >> s^2: one root r
per connected component C (of the positive-weight edges), S = Sigma_RR (the rest, positive
definite and well conditioned), and with d = s^2 (Sigma 1_C = d_C since L 1 = 0), y = S^{-1} d_R,

    g_C = sum_{j in C} d_j - d_{R cap C}^T y,     [Sigma^{-1}]_rr = 1 / g_C,
    [Sigma^{-1}]_ii = [S^{-1}]_ii + (y_i - 1)^2 / g_C      (i in C, i != r),

the block-inverse (Schur complement) of Sigma with Sigma_Rr = d_R - S 1_R. A component with no
independent noise (g_C = 0) makes Sigma singular: an infinite slope.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from privdl.accounting.decor import DecorAccount, compose_step, step_clip_for
from privdl.accounting.secrdp import (
    MAX_SUBSETS,
    Adversary,
    SecRdpStep,
    decor_step_rdp,
    parse_adversary,
)
from privdl.errors import PrivacyError
from privdl.mechanisms.dealer import DealerCovariance, dealer_threat
from privdl.mechanisms.noise_design import NoiseDesign
from privdl.topology.graphs import Topology

__all__ = [
    "account_design",
    "dealer_step_rdp",
    "design_step_rdp",
    "sigma_inverse_diagonal_design",
    "weighted_laplacian",
]


def weighted_laplacian(
    n: int, edges: np.ndarray, weights: np.ndarray, keep: np.ndarray | None = None
) -> np.ndarray:
    """Dense L_H(w) of the subgraph induced on ``keep`` (relabelled 0..|H|-1 in order)."""
    if keep is None:
        keep = np.ones(n, dtype=bool)
    new_id = np.cumsum(keep) - 1
    mask = keep[edges[:, 0]] & keep[edges[:, 1]] if len(edges) else np.zeros(0, dtype=bool)
    u, v, w = new_id[edges[mask, 0]], new_id[edges[mask, 1]], weights[mask]
    h = int(keep.sum())
    lap = np.zeros((h, h))
    np.add.at(lap, (u, u), w)
    np.add.at(lap, (v, v), w)
    np.add.at(lap, (u, v), -w)
    np.add.at(lap, (v, u), -w)
    return lap


def sigma_inverse_diagonal_design(node_var: np.ndarray, lap: np.ndarray) -> np.ndarray:
    """diag((diag(node_var) + lap)^{-1}) by grounding (module docstring); inf where singular."""
    h = len(node_var)
    if h == 0:
        return np.zeros(0)
    adj = sp.csr_matrix(np.where(lap < 0, 1.0, 0.0))
    _, labels = connected_components(adj, directed=False)
    # root of each component: its node with the largest own variance (g_C loses least to rounding)
    order = np.lexsort((-node_var, labels))
    first = np.concatenate([[True], labels[order][1:] != labels[order][:-1]])
    roots = order[first]
    rest = np.ones(h, dtype=bool)
    rest[roots] = False
    totals = np.bincount(labels, weights=node_var)
    out = np.empty(h)
    if rest.any():
        s_rr = np.diag(node_var[rest]) + lap[np.ix_(rest, rest)]
        factor = sla.cho_factor(s_rr, lower=True)
        s_inv = sla.cho_solve(factor, np.eye(int(rest.sum())))
        y = s_inv @ node_var[rest]
        totals = totals - np.bincount(
            labels[rest], weights=node_var[rest] * y, minlength=len(totals)
        )
    with np.errstate(divide="ignore"):
        inv_g = np.where(totals > 0, 1.0 / np.maximum(totals, 0.0), np.inf)
    out[roots] = inv_g[labels[roots]]
    if rest.any():
        out[rest] = np.diag(s_inv) + (y - 1.0) ** 2 * inv_g[labels[rest]]
    # Sigma >= diag(d): no diagonal entry of the inverse exceeds 1/d_i (rounding above it)
    with np.errstate(divide="ignore"):
        return np.minimum(
            out, np.where(node_var > 0, 1.0 / np.where(node_var > 0, node_var, 1.0), np.inf)
        )


def _naive_diagonal(node_var: np.ndarray, lap: np.ndarray) -> np.ndarray:
    """The reference: one plain dense inverse."""
    if len(node_var) == 0:
        return np.zeros(0)
    return np.diag(np.linalg.inv(np.diag(node_var) + lap)).copy()


def dealer_step_rdp(
    dealer: DealerCovariance,
    *,
    clip: float = 1.0,
    adversary: str | int | Adversary = "eavesdropper",
) -> SecRdpStep:
    """Per-step RDP slope of a trusted dealer's noise (:mod:`privdl.mechanisms.dealer`) against
    the outside eavesdropper: it sees every node's privatized gradient g + Z, Z ~ N(0, Sigma) per
    coordinate, and replacing honest user i's clipped gradient shifts row i by at most 2C, so

        eps_step = (2C)^2 / 2 * max_i [Sigma^{-1}]_ii = 2 C^2 max_i [Sigma^{-1}]_ii

    (the Gaussian mechanism's Renyi divergence; Whisper D-SGD, Rodio et al., arXiv 2501.14644,
    Section 4, eq. (7)). Other threat models are refused: they assume no trusted party, and the
    dealer sees every node's noise (docs/noise-design.md)."""
    if not (clip > 0 and math.isfinite(clip)):
        raise PrivacyError(f"clip must be a positive finite number, got {clip}")
    adv = parse_adversary(adversary)
    if adv.kind != "eavesdropper":
        raise PrivacyError(
            f"a dealer's covariance (Whisper D-SGD) is accounted against the eavesdropper only, "
            f"not {adv.label}: it needs a trusted dealer who sees every node's noise"
        )
    diag = dealer.inverse_diagonal()
    i = int(np.argmax(diag))
    return SecRdpStep(2.0 * clip**2 * float(diag[i]), 0, adv.label, "dealer", (), i, False)


def design_step_rdp(
    graph: Topology,
    design: NoiseDesign | DealerCovariance,
    *,
    clip: float = 1.0,
    adversary: str | int | Adversary = "eavesdropper",
    method: str = "auto",
    max_subsets: int = MAX_SUBSETS,
    force: bool = False,
) -> SecRdpStep:
    """Per-step SecRDP slope of ``design`` against ``adversary`` (module docstring).

    Args:
        graph: a :class:`~privdl.topology.graphs.Topology` (or anything with ``edges`` and
            ``n``); the design must be for its edges.
        design: the per-node and per-edge variances.
        clip: clipping threshold C (sensitivity 2C, replace-one); C / b at example level.
        adversary: eavesdropper | curious | collusion:Q | ldp.
        method: ``auto`` (uniform designs: DECOR's accountant; curious users above
            :data:`LOWRANK_FROM` nodes: ``lowrank``), ``grounded``, ``lowrank`` (curious users
            only: one factorization and a low-rank update per deleted vertex,
            :func:`_curious_lowrank`; grounded where Sigma is ill-conditioned) or ``naive`` (one
            plain inverse per colluding set: the test oracle).
    """
    if not (clip > 0 and math.isfinite(clip)):
        raise PrivacyError(f"clip must be a positive finite number, got {clip}")
    adv = parse_adversary(adversary)
    edges = np.asarray(graph.edges, dtype=np.int64).reshape(-1, 2)
    n = int(graph.n)
    design.check_graph(edges, n)
    if isinstance(design, DealerCovariance):
        return dealer_step_rdp(design, clip=clip, adversary=adv)
    edges, w, d = design.edges, design.edge_var, design.node_var
    if adv.kind == "ldp":
        if np.any(d <= 0):
            raise PrivacyError("a node without independent noise has no LDP guarantee")
        i = int(np.argmin(d))
        return SecRdpStep(2.0 * clip**2 / float(d[i]), n - 1, "ldp", "ldp-closed-form", (), i, True)
    q = adv.q
    if q >= n:
        raise PrivacyError(f"collusion level q = {q} must be smaller than n = {n}")
    count = math.comb(n, q)
    if count > max_subsets and not force:
        raise PrivacyError(
            f"collusion level q = {q} needs {count} colluding sets (> {max_subsets}); "
            "pass force=True (CLI: --force) to enumerate them all"
        )
    scalar = design.uniform_sigmas
    if method == "auto" and scalar is not None and scalar[0] > 0:
        step = decor_step_rdp(
            graph.graph, sigma_cdp=scalar[0], sigma_cor=scalar[1], clip=clip,
            adversary=adv, max_subsets=max_subsets, force=force,
        )  # fmt: skip
        return step
    if method not in ("auto", "grounded", "naive", "lowrank"):
        raise PrivacyError(f"unknown method {method!r}; use auto, grounded, lowrank or naive")
    if q == 1 and method in ("auto", "lowrank") and (method == "lowrank" or n > LOWRANK_FROM):
        found = _curious_lowrank(n, edges, d, w)
        if found is not None:
            value, j, i = found
            keep = np.ones(n, dtype=bool)
            keep[j] = False
            lap = weighted_laplacian(n, edges, w, keep)
            parts = connected_components(sp.csr_matrix(np.where(lap < 0, 1.0, 0.0)), directed=False)
            return SecRdpStep(
                2.0 * clip**2 * value, 1, adv.label, "design-lowrank", (j,), i, parts[0] > 1
            )
    diagonal = _naive_diagonal if method == "naive" else sigma_inverse_diagonal_design
    best_set: tuple[int, ...]
    best, best_set, best_node = -np.inf, (), -1
    nodes = np.arange(n)
    for subset in itertools.combinations(range(n), q):
        keep = np.ones(n, dtype=bool)
        keep[list(subset)] = False
        diag = diagonal(d[keep], weighted_laplacian(n, edges, w, keep))
        i = int(np.argmax(diag))
        if diag[i] > best:
            best, best_set, best_node = float(diag[i]), subset, int(nodes[keep][i])
    if not math.isfinite(best):
        raise PrivacyError(
            f"the design gives no guarantee against {adv.label}: a component of the honest "
            f"graph left after deleting {list(best_set)} has no independent noise"
        )
    keep = np.ones(n, dtype=bool)
    keep[list(best_set)] = False
    lap = weighted_laplacian(n, edges, w, keep)
    parts = connected_components(sp.csr_matrix(np.where(lap < 0, 1.0, 0.0)), directed=False)[0]
    name = "design-" + ("naive" if method == "naive" else "grounded")
    return SecRdpStep(
        2.0 * clip**2 * best, q, adv.label, name, tuple(best_set), best_node, parts > 1
    )


#: ``method="auto"`` takes :func:`_curious_lowrank` for curious users above this many nodes.
LOWRANK_FROM = 100
#: :func:`_curious_lowrank` is used only where its bound on cond(Sigma) is at most this
#: (rounding about cond * 1e-16 relative); above it the grounded path (exact at any ratio).
LOWRANK_MAX_COND = 1e6
#: the deleted vertices whose low-rank maxima come closest to the largest are recomputed by
#: the grounded path (an independent check; the certificate is the larger of the two)
LOWRANK_RECHECK = 4


def _curious_lowrank(
    n: int, edges: np.ndarray, d: np.ndarray, w: np.ndarray, *, chunk: int = 128
) -> tuple[float, int, int] | None:
    """max_j max_{i != j} [Sigma_j^{-1}]_ii for curious users (every vertex j deleted) from one
    Cholesky factorization, or None where Sigma is too ill-conditioned for it (the caller then
    grounds every deletion). Returns (value, j, i).

    Deleting j leaves Sigma_j = Sigma[-j,-j] - U W U^T, U = the unit columns of j's neighbours K,
    W = diag(w_jk) (their edges to j drop out of the Laplacian). With N = Sigma^{-1} the principal
    block's inverse is P = N[-j,-j] - N[-j,j] N[j,-j] / N_jj and Woodbury's identity (Golub &
    Van Loan, Matrix Computations, 4th ed., 2.1.4) in its symmetric form gives

        [Sigma_j^{-1}]_ii = P_ii + |R_j^{-1} W^{1/2} (P U)_i^T|^2,
        R_j^T R_j = I - W^{1/2} P_KK W^{1/2}   (Cholesky; positive definite as Sigma_j is),

    every term non-negative. Cost: O(n^3) once, O(n deg^2) per vertex. The vertices closest to
    the maximum are recomputed by grounding (:data:`LOWRANK_RECHECK`)."""
    if n < 3 or np.any(d <= 0):
        return None
    wdeg = np.bincount(edges[:, 0], weights=w, minlength=n) + np.bincount(
        edges[:, 1], weights=w, minlength=n
    )
    if (float(d.max()) + 2.0 * float(wdeg.max())) / float(d.min()) > LOWRANK_MAX_COND:
        return None
    sigma = np.diag(d) + weighted_laplacian(n, edges, w)
    try:
        factor = sla.cho_factor(sigma, lower=True)
    except np.linalg.LinAlgError:
        return None
    inv = sla.cho_solve(factor, np.eye(n))
    inv = 0.5 * (inv + inv.T)
    # neighbours of every vertex (padded with a zero-weight copy of the vertex itself)
    ends = np.concatenate([edges[:, 0], edges[:, 1]])
    other = np.concatenate([edges[:, 1], edges[:, 0]])
    weight = np.concatenate([w, w])
    order = np.lexsort((other, ends))
    ends, other, weight = ends[order], other[order], weight[order]
    degree = np.bincount(ends, minlength=n)
    k = max(int(degree.max()) if len(degree) else 0, 1)
    slot = np.arange(len(ends)) - np.repeat(np.cumsum(degree) - degree, degree)
    nb = np.repeat(np.arange(n)[:, None], k, axis=1)
    wt = np.zeros((n, k))
    nb[ends, slot] = other
    wt[ends, slot] = weight
    diag = np.diag(inv)
    best = np.empty(n)
    arg = np.empty(n, dtype=np.int64)
    for start in range(0, n, chunk):
        js = np.arange(start, min(n, start + chunk))
        b = len(js)
        col = inv[:, js].T  # (b, n): N e_j
        p_diag = diag[None, :] - col**2 / diag[js][:, None]
        nbj = nb[js]  # (b, k)
        pu = (
            inv[nbj].transpose(0, 2, 1)
            - col[:, :, None] * (col[np.arange(b)[:, None], nbj] / diag[js][:, None])[:, None, :]
        )  # (b, n, k): P U (row j is zero)
        root = np.sqrt(wt[js])  # (b, k)
        p_kk = pu[np.arange(b)[:, None, None], nbj[:, :, None], np.arange(k)[None, None, :]]
        cap = np.eye(k)[None] - root[:, :, None] * p_kk * root[:, None, :]
        try:
            chol = np.linalg.cholesky(0.5 * (cap + cap.transpose(0, 2, 1)))
        except np.linalg.LinAlgError:
            return None
        scaled = (pu * root[:, None, :]).transpose(0, 2, 1)  # (b, k, n)
        solved = np.linalg.solve(chol, scaled)  # R^{-T} W^{1/2} U^T P, lower-triangular solve
        vals = p_diag + (solved**2).sum(axis=1)
        vals[np.arange(b), js] = -np.inf
        arg[js] = np.argmax(vals, axis=1)
        best[js] = vals[np.arange(b), arg[js]]
    checked = np.argsort(-best)[:LOWRANK_RECHECK]
    for j in checked:  # the grounded path for the closest vertices
        keep = np.ones(n, dtype=bool)
        keep[j] = False
        exact = sigma_inverse_diagonal_design(d[keep], weighted_laplacian(n, edges, w, keep))
        i = int(np.argmax(exact))
        if exact[i] > best[j]:
            best[j], arg[j] = float(exact[i]), int(np.arange(n)[keep][i])
    j = int(np.argmax(best))
    return float(best[j]), j, int(arg[j])


def account_design(
    graph: Topology,
    design: NoiseDesign | DealerCovariance,
    *,
    clip: float = 1.0,
    steps: int,
    delta: float,
    adversary: str = "eavesdropper",
    conversion: str | None = None,
    sampling_rate: float | None = None,
    batch_size: int | None = None,
    sampling: str = "fixed_size",
    neighbouring: str = "replace_one",
    max_subsets: int = MAX_SUBSETS,
    force: bool = False,
    method: str = "auto",
) -> DecorAccount:
    """(eps, delta)-SecLDP of T steps of DECOR with ``design`` (or of a trusted dealer's noise,
    :func:`dealer_step_rdp`, labelled ``eavesdropper+trusted-dealer``): the slope of
    :func:`design_step_rdp` composed exactly as DECOR's (:func:`privdl.accounting.decor.
    compose_step`; user level by default, example level with ``sampling_rate``)."""
    adv = parse_adversary(adversary)
    step_clip = step_clip_for(
        clip=clip, steps=steps, delta=delta, sampling_rate=sampling_rate,
        batch_size=batch_size, neighbouring=neighbouring,
    )  # fmt: skip
    step = design_step_rdp(
        graph, design, clip=step_clip, adversary=adv, method=method,
        max_subsets=max_subsets, force=force,
    )  # fmt: skip
    account = compose_step(
        step,
        clip=clip,
        steps=steps,
        delta=delta,
        conversion=conversion,
        sampling_rate=sampling_rate,
        batch_size=batch_size,
        sampling=sampling,
        neighbouring=neighbouring,
    )
    if isinstance(design, DealerCovariance):  # the label says who must be trusted
        budget = dataclasses.replace(
            account.budget, threat_model=dealer_threat(account.budget.threat_model)
        )
        account = dataclasses.replace(account, budget=budget)
    return account
