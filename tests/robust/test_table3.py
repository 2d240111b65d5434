"""Robust-HDP Table 3 closed form against the paper's printed numbers and dp-accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privdl.errors import PrivacyError
from privdl.robust.table3 import (
    BATCH_SIZES_20,
    EPS_LISTS_20,
    HDPFL_ORDERS,
    noise_multiplier,
    rdp_poisson_subsampled_gaussian,
    table3_row,
    update_variance,
)

# Table 3 of the paper, Dist1..Dist9 (copied from the paper text).
PAPER = {
    "WeiAvg": [1.02, 1.89, 0.92, 3.22, 4.58, 28.29, 9.85, 48.15, 34.91],
    "DPFedAvg": [1.27, 16.94, 16.28, 26.87, 25.64, 70.71, 18.50, 85.70, 43.20],
    "minEps": [4.68, 103.91, 103.91, 127.18, 103.91, 1868.45, 74.41, 241.37, 87.15],
    "Oracle": [0.27, 0.47, 0.07, 0.64, 0.39, 7.60, 2.25, 13.81, 5.93],
}
# Cells the paper does not reproduce within 2% (see docs/robust-hdp.md), with the measured gap.
KNOWN_GAPS = {("DPFedAvg", 5): 0.06, ("minEps", 5): 0.30, ("minEps", 7): 0.05,
              ("Oracle", 2): None}  # fmt: skip


@pytest.fixture(scope="module")
def table() -> dict[str, list[float]]:
    rows = [table3_row(EPS_LISTS_20[f"Dist{d}"]) for d in range(1, 10)]
    return {k: [r[k] for r in rows] for k in PAPER}


@pytest.mark.parametrize("rule", list(PAPER))
def test_table3_matches_paper(table, rule) -> None:
    """Within 2% (or the printed 2-decimal precision, 0.005) in every consistent cell."""
    for d, (ours, paper) in enumerate(zip(table[rule], PAPER[rule], strict=True)):
        gap = KNOWN_GAPS.get((rule, d), 0.02)
        if gap is None:  # printed value below its own rounding: compare at 2-decimal precision
            assert abs(ours - paper) <= 0.01, (rule, d, ours, paper)
        else:
            assert abs(ours - paper) <= max(gap * paper, 0.005), (rule, d + 1, ours, paper)


def test_known_gaps_are_real(table) -> None:
    """The documented exceptions really exceed 2% (so the loosened cells stay justified)."""
    for (rule, d), _ in KNOWN_GAPS.items():
        ours, paper = table[rule][d], PAPER[rule][d]
        assert abs(ours - paper) > 0.02 * paper, (rule, d + 1)


def test_rdp_matches_dp_accounting() -> None:
    """Independent oracle: dp-accounting's per-order loop for the Poisson-sampled Gaussian."""
    rdp_mod = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")
    ref_fn = rdp_mod._compute_rdp_poisson_subsampled_gaussian
    for q, z in [(16 / 2400, 1.3), (128 / 2400, 5.0), (64 / 2400, 40.0), (0.01, 211.79)]:
        ours = rdp_poisson_subsampled_gaussian(q, z)[0]
        ref = ref_fn(q, z, HDPFL_ORDERS)
        np.testing.assert_allclose(ours, ref, rtol=1e-6)


def test_noise_multiplier_spec_values() -> None:
    """Table 3 settings (N = 2400, E = 200, delta = 1e-4): z(eps=1) = 5.147, 7.245, 10.221, 14.437 for b = 16..128, and eps(z) = eps."""
    z = noise_multiplier([1.0] * 4, [16, 32, 64, 128], decimals=None)
    np.testing.assert_allclose(z, [5.147, 7.245, 10.221, 14.437], atol=1e-3)
    assert noise_multiplier([2.81], [32])[0] == pytest.approx(2.78)  # authors' code, Dist1 client 0
    rdp = rdp_poisson_subsampled_gaussian(16 / 2400, z[0]) * 200 * 2400 / 16
    eps = np.min(rdp + math.log(1e4) / (np.asarray(HDPFL_ORDERS) - 1))
    assert abs(eps - 1.0) < 1e-6


def test_update_variance_and_oracle_weights() -> None:
    """Spec appendix: Dist1 oracle weights; client 13 (the only b = 128) dominates with 0.387."""
    b = np.asarray(BATCH_SIZES_20)
    s = update_variance(noise_multiplier(EPS_LISTS_20["Dist1"], b), b)
    w = (1 / s) / (1 / s).sum()
    assert round(float(w[13]), 3) == 0.387 and int(np.argmax(w)) == 13
    assert update_variance(np.array([2.0]), [16])[0] == pytest.approx(150 * 9 * 4 / 256)


def test_bad_inputs() -> None:
    with pytest.raises(PrivacyError):
        noise_multiplier([0.0], [16])
    with pytest.raises(PrivacyError):
        table3_row([1.0, 2.0], [16])
