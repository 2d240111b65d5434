"""SecRDP accountant for DECOR (Allouah et al., ICML 2024, Algorithms 2 and 3, Theorems 1 and 6).

For a colluding set I with |I| = q and H = [n] minus I, one DECOR step seen by the colluders is a
Gaussian mechanism with covariance (per coordinate, eq. 18)

    Sigma_I = sigma_cdp^2 I_{n-q} + sigma_cor^2 L_H,      L_H = Laplacian of the induced G[H],

and a change of one honest user's clipped gradient (norm <= C, replace-one, shift <= 2C) gives the
Renyi divergence alpha * 2 C^2 [Sigma_I^{-1}]_ii (Lemma 4). Algorithm 3 returns the per-step slope

    eps_step(q) = 2 C^2 max_{|I| = q} max_{i in H} [Sigma_I^{-1}]_ii,

so each step is (alpha, alpha * eps_step)-SecRDP for every alpha > 1. Algorithm 2 is q = 0.

Exact algorithms implemented here (all return the same number; see docs/accounting.md). Every one
separates the component-constant null space of L_H exactly (:mod:`privdl.accounting._sigma_inverse`),
so the answer keeps its accuracy at any ratio sigma_cor / sigma_cdp (a plain inverse does not: it
loses the dominant 1/(m sigma_cdp^2) term once sigma_cor^2 lambda_max / sigma_cdp^2 nears 1e16, and
a Woodbury update on it much earlier).

* ``dense``: one deflated dense inverse A = Sigma + sigma_cor^2 kappa P per colluding set.
* ``dense+lowrank``: q >= 1 from ONE deflated inverse of the graph with q - 1 vertices deleted:
  deleting v removes row/column v, lowers the degree of each neighbour by one and changes the
  components of v's component, a signed low-rank update of A[-v,-v]; the principal sub-block's
  inverse is N[-v,-v] - N[-v,v] N[v,-v] / N[v,v] and Woodbury handles the rest, so all n
  deletions cost O(n^2 deg) instead of n factorizations.
* ``sparse-selinv``: for large sparse graphs, one vertex per component is grounded and the rest,
  Sigma_RR, gets one sparse LDL^T factorization (SuperLU with a symmetric minimum-degree ordering
  and no pivoting) followed by the Takahashi selected-inversion recursion, which yields every
  diagonal entry of Sigma_RR^{-1} exactly (to rounding) without forming the inverse; the grounded
  vertices enter through a scalar Schur complement. Falls back to blockwise sparse solves if the
  factor's pattern is not closed.
* ``naive``: the reference loop (one dense inverse per colluding set, no low-rank update), kept
  for tests and benchmarks.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from privdl.accounting._graph import (
    algebraic_connectivity,
    edge_array,
    laplacian,
    translation_shape,
)
from privdl.accounting._radau import auto_steps, radau_upper_diagonal
from privdl.accounting._sigma_inverse import (
    deletion_maxima,
    sigma_inverse_diagonal,
)
from privdl.errors import PrivacyError

#: Default maximum number of colluding sets Algorithm 3 enumerates without ``force=True``.
MAX_SUBSETS = 100_000
#: Largest n handled with dense linear algebra by ``method="auto"``.
DENSE_LIMIT = 2000
#: From this many nodes the sparse path of Algorithm 3 (q >= 1) enumerates only the colluding
#: sets that contain vertex 0 when the graph is circulant in its labelling (a ring: n times
#: fewer sets; :func:`~privdl.accounting._graph.shift_invariant`), and likewise on a torus in
#: row-major order (its translations, :func:`~privdl.accounting._graph.translation_shape`). Below
#: it every set is
#: enumerated, as before (the same numbers to the last bit: symmetric sets agree only up to
#: rounding).
SYMMETRY_MIN_NODES = 20_000
#: The curious user on a translation-invariant graph (ring, torus) takes
#: :func:`translation_deletion_diagonal` (FFT and a rank-deg update, no factorization) while the
#: bound ``1 + 2 d sigma_cor^2 / sigma_cdp^2`` on the condition number of Sigma is at most this;
#: beyond, the sparse selected inverse of ``G - 0`` (exact at any ratio, slower).
FOURIER_MAX_COND = 1e4
#: Relative amount the Fourier path's value is rounded up by. Its update cancels (the constant
#: mode 1/(n sigma_cdp^2) in ``N[i,i] - N[i,0]^2 / N[0,0]``); measured against one plain inverse
#: per deleted vertex up to the bound above it stays within 8e-12 relative (docs/accounting.md),
#: so rounding up by over 100 times that keeps it from reporting less than the exact value.
FOURIER_ROUND_UP = 1e-9
#: From this many nodes, the eavesdropper (q = 0) on a graph with no recognised symmetry takes the
#: certified upper bound ``gauss-radau`` under ``method="auto"`` (the exact sparse selected
#: inverse fills in on an expander: a random 6-regular graph of 10^4 nodes did not finish in 5
#: minutes). Below it nothing changes.
RADAU_MIN_NODES = 20_000
#: Relative amount the ``gauss-radau`` bound is rounded up by: against the exact diagonal (dense
#: deflated inverse) its float64 rounding was measured far below this (docs/accounting.md).
RADAU_ROUND_UP = 1e-9


class PrivacyWarning(UserWarning):
    """A privacy guarantee is valid but weaker than expected (e.g. a disconnected graph)."""


@dataclass(frozen=True)
class Adversary:
    """Threat model of DECOR's SecLDP (DECOR Section 2): ``kind`` and collusion level ``q``."""

    kind: str  # "eavesdropper" | "curious" | "collusion" | "ldp"
    q: int

    @property
    def label(self) -> str:
        """The threat-model label used in :class:`PrivacyBudget`."""
        return f"collusion:{self.q}" if self.kind == "collusion" else self.kind


def parse_adversary(spec: str | int | Adversary) -> Adversary:
    """Parse ``eavesdropper`` (q = 0), ``curious`` (q = 1), ``collusion:Q`` or ``ldp``;
    ``collusion:0`` and ``collusion:1`` are the eavesdropper and the curious user, labelled so."""
    if isinstance(spec, Adversary):
        return spec
    if isinstance(spec, int) and not isinstance(spec, bool):
        spec = f"collusion:{spec}"
    text = str(spec).strip().lower()
    if text == "eavesdropper":
        return Adversary("eavesdropper", 0)
    if text == "curious":
        return Adversary("curious", 1)
    if text == "ldp":
        return Adversary("ldp", 0)
    if text.startswith("collusion:"):
        try:
            q = int(text.split(":", 1)[1])
        except ValueError:
            raise PrivacyError(f"collusion level must be an integer: {spec!r}") from None
        if q < 0:
            raise PrivacyError(f"collusion level q must be >= 0, got {q}")
        if q <= 1:  # the same threat models under their own names (one label per meaning)
            return parse_adversary("eavesdropper" if q == 0 else "curious")
        return Adversary("collusion", q)
    raise PrivacyError(f"unknown adversary {spec!r}; use eavesdropper, curious, collusion:Q or ldp")


@dataclass(frozen=True)
class SecRdpStep:
    """Result of Algorithms 2/3: the per-step RDP slope and where the maximum is attained."""

    step_rdp: float
    q: int
    adversary: str
    method: str
    worst_colluders: tuple[int, ...]
    worst_node: int
    disconnected: bool

    @property
    def bound_note(self) -> str:
        """What a budget's notes add when ``step_rdp`` is a certified upper bound
        (``gauss-radau:K``) rather than the exact value; empty otherwise."""
        if not self.method.startswith("gauss-radau"):
            return ""
        return (
            f"; step RDP bounded from above ({self.method}: Gauss-Radau quadrature, "
            "docs/accounting.md section 1)"
        )


def _check_sigmas(sigma_cdp: float, sigma_cor: float, clip: float) -> None:
    if not (sigma_cdp > 0 and math.isfinite(sigma_cdp)):
        raise PrivacyError(f"sigma_cdp must be a positive finite number, got {sigma_cdp}")
    if not (sigma_cor >= 0 and math.isfinite(sigma_cor)):
        raise PrivacyError(f"sigma_cor must be a non-negative finite number, got {sigma_cor}")
    if not (clip > 0 and math.isfinite(clip)):
        raise PrivacyError(f"clip must be a positive finite number, got {clip}")


def _n_subsets(n: int, q: int) -> int:
    return math.comb(n, q)


def _is_connected(n: int, edges: np.ndarray, keep: np.ndarray) -> bool:
    lap = laplacian(n, edges, keep)
    if lap.shape[0] <= 1:
        return True
    adj = sp.csr_matrix(lap)
    adj.setdiag(0)
    adj.eliminate_zeros()
    return connected_components(adj, directed=False)[0] == 1


def decor_step_rdp(
    graph: nx.Graph,
    *,
    sigma_cdp: float,
    sigma_cor: float,
    clip: float = 1.0,
    adversary: str | int | Adversary = "eavesdropper",
    method: str = "auto",
    max_subsets: int = MAX_SUBSETS,
    force: bool = False,
    dense_limit: int = DENSE_LIMIT,
    symmetry_min_nodes: int = SYMMETRY_MIN_NODES,
    radau_min_nodes: int = RADAU_MIN_NODES,
    radau_steps: int | None = None,
) -> SecRdpStep:
    """Per-step SecRDP slope eps_step of DECOR (Alg 2 for q = 0, Alg 3 for q >= 1).

    Args:
        graph: undirected ``networkx.Graph`` on nodes ``0..n-1`` (or an object with ``.graph``).
        sigma_cdp: std of the independent noise (> 0).
        sigma_cor: std of the pairwise-cancelling noise on each edge (>= 0).
        clip: clipping threshold C; the per-step sensitivity is 2C (replace-one). For
            example-level privacy with batch mean over b examples pass ``clip = C / b``.
        adversary: ``eavesdropper`` (q = 0), ``curious`` (q = 1), ``collusion:Q``, ``ldp``.
        method: ``auto``, ``dense``, ``dense+lowrank``, ``sparse-selinv``, ``naive`` or
            ``gauss-radau`` (q = 0 only: a certified UPPER BOUND, not the exact value, by
            Gauss-Radau quadrature, :mod:`privdl.accounting._radau`; ``auto`` takes it from
            ``radau_min_nodes`` nodes when the graph has no recognised symmetry).
        max_subsets: enumeration limit of Alg 3 (number of colluding sets C(n, q)).
        force: enumerate beyond ``max_subsets``.
        dense_limit: ``auto`` uses dense linear algebra up to this many nodes.
        symmetry_min_nodes: from this many nodes the sparse path of Alg 3 enumerates only the
            colluding sets containing vertex 0 on a graph that the cyclic shift maps onto
            itself (every other set is a shift of one of them: the same maximum); the method
            is then labelled ``sparse-selinv+cyclic-symmetry``. The same holds for the
            translations of a row-major ``r x c`` torus (``sparse-selinv+translation-symmetry``;
            the eavesdropper's value is then the closed form ``translation-invariant``).
        radau_min_nodes: ``auto`` bounds the eavesdropper by ``gauss-radau`` from this many
            nodes on a graph without recognised symmetry.
        radau_steps: Lanczos steps of ``gauss-radau`` (more: tighter and slower); ``None``: the
            most, up to 6, whose work fits a budget (:func:`privdl.accounting._radau.auto_steps`:
            6 on random 6-regular graphs up to about 44,000 nodes, 5 at 10^5).

    Returns:
        :class:`SecRdpStep`; each step is (alpha, alpha * step_rdp)-SecRDP for every alpha > 1.
    """
    _check_sigmas(sigma_cdp, sigma_cor, clip)
    adv = parse_adversary(adversary)
    n, edges = edge_array(graph)
    q = adv.q
    ldp_value = 2.0 * clip**2 / sigma_cdp**2
    if adv.kind == "ldp":
        return SecRdpStep(ldp_value, n - 1, "ldp", "ldp-closed-form", (), 0, True)
    if q >= n:
        raise PrivacyError(f"collusion level q = {q} must be smaller than n = {n}")
    shape = translation_shape(n, edges) if n >= symmetry_min_nodes else None
    symmetric = q >= 1 and shape is not None
    count = _n_subsets(n - 1, q - 1) if symmetric else _n_subsets(n, q)
    if count > max_subsets and not force:
        raise PrivacyError(
            f"collusion level q = {q} needs {count} colluding sets (> {max_subsets}); "
            "pass force=True (CLI: --force) to enumerate them all"
        )
    if sigma_cor**2 == 0.0:  # Sigma = sigma_cdp^2 I for every I: the LDP value
        keep = np.ones(n, dtype=bool)
        keep[:q] = False
        disc = not _is_connected(n, edges, keep)
        return SecRdpStep(ldp_value, q, adv.label, "closed-form", tuple(range(q)), q, disc)
    if q == 0 and shape is not None:
        # vertex-transitive by translations: every diagonal entry of Sigma^{-1} is the same, the
        # mean of the inverse eigenvalues (one closed form, O(n deg), every term positive: exact
        # at any ratio)
        if shape[0] == 1:
            value, label = circulant_inverse_diagonal(n, edges, sigma_cdp, sigma_cor), "circulant"
        else:
            value = torus_inverse_diagonal(n, edges, shape, sigma_cdp, sigma_cor)
            label = "translation-invariant"
        disc = not _is_connected(n, edges, np.ones(n, dtype=bool))
        value = min(value, 1.0 / sigma_cdp**2)
        return SecRdpStep(2.0 * clip**2 * value, 0, adv.label, label, (), 0, disc)
    if q == 1 and shape is not None and method == "auto":
        keep = np.ones(n, dtype=bool)
        keep[0] = False
        degree = int(np.count_nonzero(edges == 0))
        if 1.0 + 2.0 * degree * sigma_cor**2 / sigma_cdp**2 <= FOURIER_MAX_COND and _is_connected(
            n, edges, keep
        ):
            value, worst_node = translation_deletion_diagonal(n, edges, shape, sigma_cdp, sigma_cor)
            value = min(value * (1.0 + FOURIER_ROUND_UP), 1.0 / sigma_cdp**2)
            step = 2.0 * clip**2 * value
            return SecRdpStep(step, 1, adv.label, "fourier+deletion", (0,), worst_node, False)
    if method == "auto" and q == 0 and n >= radau_min_nodes and n > dense_limit:
        # no closed form and every vertex of degree >= 3 (random regular graphs are expanders,
        # whose factor fills in): bound it. Paths, grids, stars and trees have vertices of lower
        # degree and small separators, so their exact sparse selected inverse stays.
        degrees = np.bincount(np.asarray(edges, dtype=np.int64).ravel(), minlength=n)
        if shape is None and int(degrees.min()) >= 3 and translation_shape(n, edges) is None:
            method = "gauss-radau"
    if method == "gauss-radau":
        if q != 0:
            raise PrivacyError("method gauss-radau bounds the eavesdropper only (q = 0)")
        lap = laplacian(n, edges)
        if radau_steps is None:
            radau_steps = auto_steps(lap)
        diag = radau_upper_diagonal(lap, sigma_cdp, sigma_cor, steps=radau_steps)
        worst = int(np.argmax(diag))
        value = min(float(diag[worst]) * (1.0 + RADAU_ROUND_UP), 1.0 / sigma_cdp**2)
        disc = not _is_connected(n, edges, np.ones(n, dtype=bool))
        if disc:
            warnings.warn(
                "the graph is disconnected; epsilon falls towards the LDP level",
                PrivacyWarning,
                stacklevel=2,
            )
        step = 2.0 * clip**2 * value
        return SecRdpStep(step, 0, adv.label, f"gauss-radau:{radau_steps}", (), worst, disc)
    if method == "auto":
        if n > dense_limit:
            method = "sparse-selinv"
        else:
            method = "dense" if q == 0 else "dense+lowrank"
    if method in ("naive", "dense"):
        value, worst_set, worst_node = _enumerate(n, edges, q, sigma_cdp, sigma_cor, dense=True)
    elif method == "dense+lowrank":
        if q == 0:
            value, worst_set, worst_node = _enumerate(n, edges, 0, sigma_cdp, sigma_cor, True)
        else:
            value, worst_set, worst_node = _lowrank(n, edges, q, sigma_cdp, sigma_cor)
    elif method == "sparse-selinv":
        value, worst_set, worst_node = _enumerate(
            n, edges, q, sigma_cdp, sigma_cor, dense=False, containing_zero=symmetric
        )
        if symmetric:
            assert shape is not None
            symmetry = "cyclic" if shape[0] == 1 else "translation"
            method = f"sparse-selinv+{symmetry}-symmetry"
    else:
        raise PrivacyError(
            f"unknown method {method!r}; use auto, dense, dense+lowrank, sparse-selinv, "
            "gauss-radau or naive"
        )
    keep = np.ones(n, dtype=bool)
    keep[list(worst_set)] = False
    disconnected = not _is_connected(n, edges, keep)
    if disconnected:
        warnings.warn(
            f"the graph left after deleting colluders {list(worst_set)} is disconnected; "
            "epsilon falls towards the LDP level (DECOR needs a (q+1)-connected graph)",
            PrivacyWarning,
            stacklevel=2,
        )
    # Sigma >= sigma_cdp^2 I, so no diagonal entry of its inverse exceeds 1/sigma_cdp^2 (the LDP
    # level); anything above it is rounding error.
    value = min(value, 1.0 / sigma_cdp**2)
    step = 2.0 * clip**2 * value
    return SecRdpStep(float(step), q, adv.label, method, worst_set, int(worst_node), disconnected)


def circulant_inverse_diagonal(
    n: int, edges: np.ndarray, sigma_cdp: float, sigma_cor: float
) -> float:
    """The (common) diagonal entry of ``(sigma_cdp^2 I + sigma_cor^2 L)^{-1}`` for a graph the
    cyclic shift maps onto itself: ``L`` is circulant with eigenvalues
    ``lambda_j = sum_{d in D} 2 sin^2(pi j d / n)`` (``D`` the neighbours of vertex 0), so the
    entry is ``(1/n) sum_j 1 / (sigma_cdp^2 + sigma_cor^2 lambda_j)`` (Gray 2006, Toeplitz and
    circulant matrices, Sec. 3.1)."""
    offsets = np.concatenate([edges[edges[:, 0] == 0, 1], edges[edges[:, 1] == 0, 0]])
    j = np.arange(n, dtype=np.float64)[:, None]
    lam = (2.0 * np.sin(np.pi * j * offsets[None, :].astype(np.float64) / n) ** 2).sum(1)
    return float(np.mean(1.0 / (sigma_cdp**2 + sigma_cor**2 * lam)))


def torus_inverse_diagonal(
    n: int, edges: np.ndarray, shape: tuple[int, int], sigma_cdp: float, sigma_cor: float
) -> float:
    """The (common) diagonal entry of ``(sigma_cdp^2 I + sigma_cor^2 L)^{-1}`` for a graph whose
    row-major ``r x c`` translations are automorphisms (:func:`~privdl.accounting._graph.
    translation_shape`; a torus): it is a Cayley graph of ``Z_r x Z_c`` whose connection set ``D``
    is vertex 0's neighbours ``(d_1, d_2) = (v // c, v % c)``, so the characters diagonalise ``L``
    with eigenvalues ``lambda_ab = sum_{d in D} 2 sin^2(pi (a d_1 / r + b d_2 / c))`` (Babai 1979,
    spectra of Cayley graphs; the block-circulant case of Gray 2006, Sec. 3.1) and the entry is
    their inverse mean, as in :func:`circulant_inverse_diagonal`."""
    r, c = shape
    offsets = np.concatenate([edges[edges[:, 0] == 0, 1], edges[edges[:, 1] == 0, 0]])
    d1 = (offsets // c).astype(np.float64)[None, :]
    d2 = (offsets % c).astype(np.float64)[None, :]
    a = np.repeat(np.arange(r, dtype=np.float64), c)[:, None]
    b = np.tile(np.arange(c, dtype=np.float64), r)[:, None]
    lam = (2.0 * np.sin(np.pi * (a * d1 / r + b * d2 / c)) ** 2).sum(1)
    return float(np.mean(1.0 / (sigma_cdp**2 + sigma_cor**2 * lam)))


def translation_deletion_diagonal(
    n: int, edges: np.ndarray, shape: tuple[int, int], sigma_cdp: float, sigma_cor: float
) -> tuple[float, int]:
    """``max_i [Sigma_I^{-1}]_ii`` and its ``i`` for the curious user (``I = {0}``; any other
    vertex gives the same maximum, :func:`~privdl.accounting._graph.translation_shape`) of a
    graph whose ``r x c`` translations are automorphisms, in O(n log n + n deg^2), no
    factorization.

    ``N = Sigma^{-1}`` of the whole graph is a convolution on ``Z_r x Z_c``: ``N_ij = f(i - j)``
    with ``f`` the inverse 2-D DFT of the eigenvalues ``1 / (sigma_cdp^2 + sigma_cor^2
    lambda_ab)`` (:func:`torus_inverse_diagonal`). Deleting vertex 0 removes its row and column,
    whose inverse is ``B = N[-0,-0] - N[-0,0] N[0,-0] / N[0,0]`` (the block inverse), and lowers
    the degree of each neighbour ``s in S`` by one: ``Sigma_I = Sigma[-0,-0] - sigma_cor^2 E_S
    E_S^T``, so by Woodbury ``Sigma_I^{-1} = B + B E_S (I / sigma_cor^2 - B_SS)^{-1} E_S^T B``
    (the same update as the ``dense+lowrank`` path, here on an implicit ``B``). The caller keeps
    the conditioning bound ``1 + 2 d sigma_cor^2 / sigma_cdp^2`` below
    :data:`FOURIER_MAX_COND`, where the update loses no more than rounding."""
    r, c = shape
    offsets = np.concatenate([edges[edges[:, 0] == 0, 1], edges[edges[:, 1] == 0, 0]])
    d1, d2 = offsets // c, offsets % c
    a = np.arange(r, dtype=np.float64)[:, None, None]
    b = np.arange(c, dtype=np.float64)[None, :, None]
    lam = (2.0 * np.sin(np.pi * (a * d1 / r + b * d2 / c)) ** 2).sum(-1)
    f = np.fft.ifft2(1.0 / (sigma_cdp**2 + sigma_cor**2 * lam)).real  # f[x] = N[x, 0]
    f0 = f[0, 0]
    column = [
        np.roll(f, (int(s1), int(s2)), axis=(0, 1)).ravel() for s1, s2 in zip(d1, d2, strict=True)
    ]
    flat = f.ravel()
    b_cols = np.stack(column, axis=1) - np.outer(flat, flat[offsets]) / f0  # B[:, s], (n, deg)
    b_ss = b_cols[offsets]
    capacitance = np.eye(len(offsets)) / sigma_cor**2 - b_ss
    diag = f0 - flat**2 / f0 + np.einsum("is,is->i", b_cols @ np.linalg.inv(capacitance), b_cols)
    diag[0] = -np.inf  # vertex 0 is the colluder
    worst = int(np.argmax(diag))
    return float(diag[worst]), worst


def _enumerate(
    n: int,
    edges: np.ndarray,
    q: int,
    sigma_cdp: float,
    sigma_cor: float,
    dense: bool,
    *,
    containing_zero: bool = False,
) -> tuple[float, tuple[int, ...], int]:
    """Alg 3 by enumeration: max over |I| = q of max_i [Sigma_I^{-1}]_ii (one inverse per I);
    ``containing_zero``: only the sets I with 0 in I (enough where the cyclic shift is an
    automorphism, q >= 1)."""
    best_set: tuple[int, ...]
    best, best_set, best_node = -np.inf, (), -1
    nodes = np.arange(n)
    subsets = (
        ((0, *rest) for rest in itertools.combinations(range(1, n), q - 1))
        if containing_zero
        else itertools.combinations(range(n), q)
    )
    for subset in subsets:
        keep = np.ones(n, dtype=bool)
        keep[list(subset)] = False
        diag = sigma_inverse_diagonal(
            laplacian(n, edges, keep), sigma_cdp, sigma_cor, sparse=not dense
        )
        i = int(np.argmax(diag))
        if diag[i] > best:
            best, best_set, best_node = float(diag[i]), subset, int(nodes[keep][i])
    return best, tuple(best_set), best_node


def _lowrank(
    n: int, edges: np.ndarray, q: int, sigma_cdp: float, sigma_cor: float
) -> tuple[float, tuple[int, ...], int]:
    """Alg 3 for q >= 1: enumerate (q-1)-sets, then all last deletions by low-rank updates."""
    best_set: tuple[int, ...]
    best, best_set, best_node = -np.inf, (), -1
    for subset in itertools.combinations(range(n), q - 1):
        keep = np.ones(n, dtype=bool)
        keep[list(subset)] = False
        remaining = np.flatnonzero(keep)
        maxima, args = deletion_maxima(laplacian(n, edges, keep), sigma_cdp, sigma_cor)
        v = int(np.argmax(maxima))
        if maxima[v] > best:
            best = float(maxima[v])
            best_set = tuple(sorted((*subset, int(remaining[v]))))
            best_node = int(remaining[args[v]])
    return best, best_set, best_node


def a_q(graph: nx.Graph, *, q: int, max_subsets: int = MAX_SUBSETS, force: bool = False) -> float:
    """a_q(G) = min over |I| = q of the algebraic connectivity of G[[n] minus I] (Thm 6)."""
    n, edges = edge_array(graph)
    if q >= n:
        raise PrivacyError(f"collusion level q = {q} must be smaller than n = {n}")
    count = _n_subsets(n, q)
    if count > max_subsets and not force:
        raise PrivacyError(f"a_q needs {count} subsets (> {max_subsets}); pass force=True")
    best = np.inf
    for subset in itertools.combinations(range(n), q):
        keep = np.ones(n, dtype=bool)
        keep[list(subset)] = False
        best = min(best, algebraic_connectivity(laplacian(n, edges, keep)))
    return float(best)


def theorem_bound(
    graph: nx.Graph,
    *,
    sigma_cdp: float,
    sigma_cor: float,
    clip: float = 1.0,
    adversary: str | int | Adversary = "eavesdropper",
    max_subsets: int = MAX_SUBSETS,
    force: bool = False,
) -> float:
    """Closed-form upper bound of Theorem 1 (q = 0, 1) / Theorem 6 (any q < n), eq. (13):

    eps_step <= 2C^2 [1/((n-q) s^2) + (1 - 1/(n-q)) / (s^2 + a_q(G) c^2)].
    """
    _check_sigmas(sigma_cdp, sigma_cor, clip)
    adv = parse_adversary(adversary)
    n, _ = edge_array(graph)
    if adv.kind == "ldp":
        return 2.0 * clip**2 / sigma_cdp**2
    q = adv.q
    aq = a_q(graph, q=q, max_subsets=max_subsets, force=force)
    h = n - q
    s2, c2 = sigma_cdp**2, sigma_cor**2
    return 2.0 * clip**2 * (1.0 / (h * s2) + (1.0 - 1.0 / h) / (s2 + aq * c2))


def cdp_limit_step_rdp(
    graph: nx.Graph,
    *,
    sigma_cdp: float,
    clip: float = 1.0,
    adversary: str | int | Adversary = "eavesdropper",
    max_subsets: int = MAX_SUBSETS,
    force: bool = False,
) -> float:
    """lim_{sigma_cor -> inf} eps_step: 2C^2 / (s^2 * smallest component size of any G[H]).

    As sigma_cor grows, Sigma_I^{-1} tends to the projection onto the component-constant vectors
    divided by sigma_cdp^2, whose diagonal is 1/|component|. For a connected G and q = 0 this is
    the CDP value 2C^2/(n s^2). Calibration needs a per-step target strictly above this.
    """
    _check_sigmas(sigma_cdp, 0.0, clip)
    adv = parse_adversary(adversary)
    n, edges = edge_array(graph)
    if adv.kind == "ldp":
        return 2.0 * clip**2 / sigma_cdp**2
    if adv.q >= n:
        raise PrivacyError(f"collusion level q = {adv.q} must be smaller than n = {n}")
    if _n_subsets(n, adv.q) > max_subsets and not force:
        raise PrivacyError(f"q = {adv.q} needs more than {max_subsets} subsets; pass force=True")
    smallest = n
    for subset in itertools.combinations(range(n), adv.q):
        keep = np.ones(n, dtype=bool)
        keep[list(subset)] = False
        adj = sp.csr_matrix(laplacian(n, edges, keep))
        adj.setdiag(0)
        adj.eliminate_zeros()
        _, labels = connected_components(adj, directed=False)
        smallest = min(smallest, int(np.bincount(labels).min()))
    return 2.0 * clip**2 / (sigma_cdp**2 * smallest)
