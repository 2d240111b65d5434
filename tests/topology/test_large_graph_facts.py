"""``privdl graph`` on n >= 30,000 nodes (issue 38, item 7): the spectral facts without a dense
n x n matrix, against the closed forms of the ring and the torus (the Laplacian spectrum of
C_n is 2 - 2cos(2 pi k / n); of a torus, the sums of its two rings')."""

from __future__ import annotations

import json
import math
import resource

import pytest

from privdl.cli.main import main as cli_main


def _facts(spec: str, capsys) -> tuple[dict, int]:
    """The facts and this process's peak resident memory after computing them (bytes)."""
    assert cli_main(["graph", spec, "--json"]) == 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kB
    return json.loads(capsys.readouterr().out), peak


def test_a_ring_of_30000_nodes_gives_its_closed_forms_without_a_dense_matrix(capsys):
    n = 30_000
    info, peak = _facts(f"ring:{n}", capsys)
    a = 2 - 2 * math.cos(2 * math.pi / n)
    lam2, lam_min = 1 - a / 3, -1 / 3  # Metropolis on a ring: W = I - L/3 (n even)
    assert info["algebraic_connectivity"] == pytest.approx(a, rel=1e-6)
    w = info["mixing"]
    assert w["spectral_gap"] == pytest.approx(1 - max(lam2, abs(lam_min)), rel=1e-6)
    assert w["consensus_rate"] == pytest.approx(1 - lam2**2, rel=1e-6)
    assert w["heterogeneity_H"] == pytest.approx(2 / 9 * n / (2 * n), rel=1e-12)
    assert peak < 4e9  # a dense W alone would be 7.2 GB


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["ring:100000", "torus:300x300", "regular:100000:6:1"])
def test_the_issues_large_graphs_finish_without_a_dense_matrix(capsys, spec):
    info, peak = _facts(spec, capsys)
    assert peak < 8e9 and info["connected"]  # a dense W: 65-80 GB
    if spec.startswith("torus"):
        a = 2 - 2 * math.cos(2 * math.pi / 300)  # the smallest non-zero of one ring's
        assert info["algebraic_connectivity"] == pytest.approx(a, rel=1e-6)
    w = info["mixing"]
    assert 0 < w["spectral_gap"] <= w["consensus_rate"] <= 2 * w["spectral_gap"]
