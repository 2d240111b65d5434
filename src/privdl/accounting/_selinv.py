"""Supernodal selected inversion: the exact diagonal of A^{-1} from a sparse LDL^T factor.

Takahashi's identities (Takahashi, Fagan, Chin 1973; supernodal form as in Lin et al. 2011,
"SelInv"): with A = L D L^T and Z = A^{-1}, for a supernode J (consecutive columns sharing the
below-diagonal pattern R) and Lhat = L_RJ L_JJ^{-1},

    Z_RJ = -Z_RR Lhat,        Z_JJ = L_JJ^{-T} D_J^{-1} L_JJ^{-1} - Lhat^T Z_RJ.

Processing supernodes from the last to the first only ever needs Z on the pattern of L, which is
what is stored. Used by :func:`privdl.accounting.secrdp.diag_inverse_sparse`.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg


def _ragged_arange(counts: np.ndarray) -> np.ndarray:
    """Concatenation of arange(c) for c in counts."""
    total = int(counts.sum())
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(total) - starts


def supernodes(ptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Start columns of fundamental supernodes (plus n at the end).

    Columns j and j+1 are merged when the pattern of j is exactly {j+1} + pattern(j+1).
    """
    n = len(ptr) - 1
    cnt = np.diff(ptr)
    j = np.arange(n - 1)
    cand = (cnt[:-1] == cnt[1:] + 1) & (cnt[:-1] > 0)
    cand[cand] &= rows[ptr[j[cand]]] == j[cand] + 1
    cj = j[cand]
    tail = cnt[cj + 1]
    off = _ragged_arange(tail)
    a = np.repeat(ptr[cj] + 1, tail) + off
    b = np.repeat(ptr[cj + 1], tail) + off
    mismatch = np.bincount(
        np.repeat(np.arange(len(cj)), tail), weights=rows[a] != rows[b], minlength=len(cj)
    )
    link = np.zeros(n - 1, dtype=bool)
    link[cj[mismatch == 0]] = True
    starts = np.flatnonzero(np.concatenate([[True], ~link]))
    return np.concatenate([starts, [n]])


def selected_inverse_diagonal(
    ptr: np.ndarray, rows: np.ndarray, vals: np.ndarray, d: np.ndarray
) -> np.ndarray | None:
    """diag(Z) for A = L D L^T given the strictly-lower part of L in CSC form.

    Args:
        ptr, rows, vals: CSC arrays of the strictly lower triangle of unit-lower L, rows sorted.
        d: the diagonal D.

    Returns:
        The diagonal of A^{-1}, or None if a needed entry is outside the stored pattern.
    """
    n = len(ptr) - 1
    keys = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr)) * n + rows
    z_off = np.zeros(len(vals))
    z_diag = np.zeros(n)
    bounds = supernodes(ptr, rows)
    for s in range(len(bounds) - 2, -1, -1):  # sequential by construction
        a, e = int(bounds[s]), int(bounds[s + 1])
        w = e - a
        last = e - 1
        big_r = rows[ptr[last] : ptr[last + 1]]
        r = len(big_r)
        # index of entry (u, t) of the (w + r) x w panel below the diagonal in z_off / vals
        u = np.arange(w + r)[:, None]
        t = np.arange(w)[None, :]
        below = u > t
        idx = np.where(below, ptr[a : a + w][None, :] + u - t - 1, 0)
        panel = np.where(below, vals[idx], 0.0)
        l_jj = panel[:w] + np.eye(w)
        l_rj = panel[w:]
        if w == 1:  # most supernodes: skip the triangular solves
            z_jj = np.array([[1.0 / d[a]]])
        else:
            l_inv = scipy.linalg.solve_triangular(
                l_jj, np.eye(w), lower=True, unit_diagonal=True, check_finite=False
            )
            z_jj = (l_inv.T / d[a:e][None, :]) @ l_inv
        if r:
            lo = np.minimum.outer(big_r, big_r)
            hi = np.maximum.outer(big_r, big_r)
            query = (lo * n + hi).ravel()
            pos = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
            on_diag = (lo == hi).ravel()
            if not np.all((keys[pos] == query) | on_diag):
                return None
            z_rr = np.where(on_diag, z_diag[hi.ravel()], z_off[pos]).reshape(r, r)
            if w == 1:
                l_hat = l_rj
            else:
                l_hat = scipy.linalg.solve_triangular(
                    l_jj, l_rj.T, trans="T", lower=True, unit_diagonal=True, check_finite=False
                ).T
            z_rj = -z_rr @ l_hat
            z_jj = z_jj - l_hat.T @ z_rj
            full = np.vstack([z_jj, z_rj])
        else:
            full = z_jj
        z_diag[a:e] = np.diag(z_jj)
        z_off[idx[below]] = full[below]
    return z_diag
