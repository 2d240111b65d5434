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
from privdl.mechanisms.noise_design import NoiseDesign
from privdl.topology.graphs import Topology

__all__ = [
    "account_design",
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


def design_step_rdp(
    graph: Topology,
    design: NoiseDesign,
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
        method: ``auto`` (uniform designs: DECOR's accountant), ``grounded`` or ``naive``
            (one plain inverse per colluding set: the test oracle).
    """
    if not (clip > 0 and math.isfinite(clip)):
        raise PrivacyError(f"clip must be a positive finite number, got {clip}")
    adv = parse_adversary(adversary)
    edges = np.asarray(graph.edges, dtype=np.int64).reshape(-1, 2)
    n = int(graph.n)
    design.check_graph(edges, n)
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
    if method not in ("auto", "grounded", "naive"):
        raise PrivacyError(f"unknown method {method!r}; use auto, grounded or naive")
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


def account_design(
    graph: Topology,
    design: NoiseDesign,
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
    """(eps, delta)-SecLDP of T steps of DECOR with ``design``: the slope of
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
    return compose_step(
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
