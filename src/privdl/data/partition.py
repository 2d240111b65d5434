"""Disjoint partitioners of a labelled training set across n nodes / clients.

* ``partition_iid`` — shuffle, then split evenly (PORTER s.5, PrivSGP-VR s.5, Robust-HDP's
  iid experiments).
* ``partition_shards`` — sort by label, cut into ``n * shards_per_part`` shards, give each part
  ``shards_per_part`` random shards (McMahan et al. 2017; Robust-HDP Tables 4 and 22, m = 8).
* ``partition_dirichlet`` — for each class, proportions p ~ Dir(alpha 1_n) over the parts
  (Wang et al. 2019; DECOR's Figs 1b-1c with alpha = 10, Robust-HDP App. G with alpha = 1).
  Chunks are cut at cumulative offsets, so they are disjoint by construction. DECOR's reference
  ``draw_indices`` does not accumulate offsets and lets chunks overlap (docs/reproductions-decor.md,
  "Deviations"); that buggy split is deliberately not reproduced.

Every partitioner returns a list of ``n_parts`` int64 index arrays; unless stated, every sample
is assigned to exactly one part.
"""

from __future__ import annotations

import numpy as np

from privdl.errors import DataError


def _generator(rng: np.random.Generator | int) -> np.random.Generator:
    """The partitioner's generator: a numpy ``Generator``, or an integer seed for a new one."""
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) and rng >= 0:
        return np.random.default_rng(int(rng))
    raise DataError(f"rng must be a numpy Generator or a non-negative integer seed, got {rng!r}")


def _check(labels: np.ndarray, n_parts: int) -> np.ndarray:
    if not isinstance(n_parts, (int, np.integer)) or isinstance(n_parts, bool):
        raise DataError(f"n_parts must be an integer, got {n_parts!r}")
    y = np.asarray(labels)
    if y.ndim != 1:
        raise DataError(f"labels must be one-dimensional, got shape {y.shape}")
    if n_parts < 1:
        raise DataError(f"n_parts must be >= 1, got {n_parts}")
    if y.shape[0] < n_parts:
        raise DataError(f"cannot split {y.shape[0]} samples into {n_parts} non-empty parts")
    return y


def partition_iid(
    labels: np.ndarray,
    n_parts: int,
    *,
    rng: np.random.Generator | int,
    drop_remainder: bool = False,
) -> list[np.ndarray]:
    """Shuffle and split evenly (part sizes differ by at most one).

    With ``drop_remainder`` every part gets floor(N / n_parts) samples and the rest are unused
    (PORTER s.5.1: m = floor(32561/10) = 3256).
    """
    y = _check(labels, n_parts)
    rng = _generator(rng)
    perm = rng.permutation(y.shape[0]).astype(np.int64)
    if drop_remainder:
        m = y.shape[0] // n_parts
        return list(perm[: m * n_parts].reshape(n_parts, m))
    return np.array_split(perm, n_parts)


def partition_shards(
    labels: np.ndarray,
    n_parts: int,
    shards_per_part: int,
    *,
    rng: np.random.Generator | int,
) -> list[np.ndarray]:
    """Sort by label, cut into ``n_parts * shards_per_part`` contiguous shards, deal them out.

    Shards have sizes differing by at most one, so every sample is assigned (Robust-HDP's code
    uses floor-sized shards and drops the leftover; for its 60,000-sample splits there is none).
    Within a label, order is randomised first so shards are random subsets of each class.
    """
    y = _check(labels, n_parts)
    rng = _generator(rng)
    if shards_per_part < 1:
        raise DataError(f"shards_per_part must be >= 1, got {shards_per_part}")
    n_shards = n_parts * shards_per_part
    if n_shards > y.shape[0]:
        raise DataError(f"{n_shards} shards need at least {n_shards} samples, got {y.shape[0]}")
    tiebreak = rng.permutation(y.shape[0])
    order = tiebreak[np.argsort(y[tiebreak], kind="stable")].astype(np.int64)
    shards = np.array_split(order, n_shards)
    deal = rng.permutation(n_shards).reshape(n_parts, shards_per_part)
    return [np.concatenate([shards[s] for s in row]) for row in deal]


def _dirichlet_cuts(
    y: np.ndarray, n_parts: int, alpha: float, rng: np.random.Generator
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per class: shuffled member indices and integer cut points from Dir(alpha) proportions."""
    classes = np.unique(y)
    props = rng.dirichlet(np.full(n_parts, alpha), size=classes.size)  # (C, n)
    members, counts = [], np.zeros((classes.size, n_parts), dtype=np.int64)
    for k, c in enumerate(classes):  # loop over classes (~10), not nodes or samples
        idx = rng.permutation(np.flatnonzero(y == c)).astype(np.int64)
        cuts = np.rint(np.cumsum(props[k]) * idx.size).astype(np.int64)
        cuts[-1] = idx.size
        counts[k] = np.diff(np.concatenate([[0], cuts]))
        members.append(idx)
    return counts, members


def partition_dirichlet(
    labels: np.ndarray,
    n_parts: int,
    alpha: float,
    *,
    rng: np.random.Generator | int,
    min_size: int = 1,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Label-skewed split: class c's samples go to the parts in proportions p_c ~ Dir(alpha 1_n).

    Class c's shuffled members are cut at the cumulative offsets round(N_c * cumsum(p_c)), so
    the chunks are disjoint and cover the class. Draws are repeated (up to ``max_tries``) until
    every part holds at least ``min_size`` samples. Small alpha -> each part dominated by few
    classes; alpha -> infinity -> iid-like proportions.
    """
    y = _check(labels, n_parts)
    rng = _generator(rng)
    if not np.isfinite(alpha) or alpha <= 0:
        raise DataError(f"Dirichlet alpha must be a positive finite number, got {alpha}")
    if min_size < 0 or min_size * n_parts > y.shape[0]:
        raise DataError(f"min_size={min_size} is impossible for {y.shape[0]} samples")
    for _ in range(max_tries):
        counts, members = _dirichlet_cuts(y, n_parts, alpha, rng)
        if counts.sum(axis=0).min() >= min_size:
            break
    else:
        raise DataError(
            f"no Dirichlet({alpha}) draw gave every part >= {min_size} samples in {max_tries} "
            "tries; raise alpha or lower min_size"
        )
    chunks = [np.split(m, np.cumsum(c)[:-1]) for m, c in zip(members, counts, strict=True)]
    return [np.concatenate([ch[j] for ch in chunks]) for j in range(n_parts)]


def parts_to_ids(parts: list[np.ndarray], n_samples: int) -> np.ndarray:
    """Part id of every sample (-1 for unassigned); DataError if a sample is in two parts."""
    ids = np.full(n_samples, -1, dtype=np.int64)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
    if np.unique(flat).size != flat.size:
        raise DataError("partition is not disjoint: some sample belongs to two parts")
    ids[flat] = owner
    return ids
