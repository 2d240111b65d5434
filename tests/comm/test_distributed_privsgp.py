"""PrivSGP-VR / PrivSGP sharded over gloo ranks end with the single-process simulator's state.

Issue 8: stochastic gradient push on 2 and 4 processes (gloo, loopback) equals the simulator
within 1e-12 in float64 — the models ``x``, the push-sum weights ``w``, the SAGA table and its
running mean. Ranks are forked children (no torch re-import); the oracle is the simulator
(:class:`LocalCommunicator` on the full problem) computed in every rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from privdl.algorithms.base import Keys, StepSize
from privdl.algorithms.privsgp import LeastSquaresSamples, ModelSamples, PrivSGP, flatten
from privdl.comm.local import LocalCommunicator
from privdl.topology import mixing_matrix, ring
from privdl.topology.timevarying import ExponentialGraph

N = 7  # uneven shards: 4/3 on 2 ranks, 2/2/2/1 on 4 ranks
J = 4  # samples per node: the running mean is refreshed exactly at t = 3 (refresh_every = J)
STEPS = 6  # two periods of the exponential graph's hops 1, 2, 4
D64 = torch.float64


def _least_squares() -> LeastSquaresSamples:
    g = torch.Generator().manual_seed(11)
    a = torch.randn(N, J, 3, generator=g, dtype=D64)
    b = torch.randn(N, J, generator=g, dtype=D64)
    return LeastSquaresSamples(a, b, clip=2.0)


def _logistic() -> tuple[ModelSamples, dict]:
    """Multinomial logistic regression (linear model, cross-entropy), blocks of 2 samples."""
    from privdl.models import build_model

    g = torch.Generator().manual_seed(12)
    x = torch.randn(N, 2 * J, 4, generator=g, dtype=D64)
    y = torch.randint(0, 3, (N, 2 * J), generator=g)
    model = build_model("linear", in_shape=(4,), n_classes=3)
    params = model.init(n_nodes=N, generator=torch.Generator().manual_seed(1), dtype=D64)
    oracle = ModelSamples(model, x, y, block_size=2, clip=0.5, table_dtype=D64)
    return oracle, params


def _cases() -> dict:
    """name -> (algorithm, full oracle, full params, schedule)."""
    sigmas = [0.05 * (i + 1) for i in range(N)]  # heterogeneous: rows must pick their own std
    ls = _least_squares()
    x0 = {"x": torch.randn(N, 3, generator=torch.Generator().manual_seed(2), dtype=D64)}
    logit, p0 = _logistic()
    return {
        "vr_expo": (PrivSGP(StepSize(0.1), sigmas=sigmas), ls, x0, ExponentialGraph(N)),
        "sgp_expo": (
            PrivSGP(StepSize(0.1), sigmas=0.2, variance_reduction=False),
            ls,
            x0,
            ExponentialGraph(N),
        ),
        "vr_ring_logistic": (
            PrivSGP(StepSize(0.5), sigmas=sigmas),
            logit,
            p0,
            mixing_matrix(ring(N), "metropolis"),
        ),
    }


def _worker(rank: int, out: str) -> None:
    from privdl.comm.distributed import DistributedCommunicator, init_from_env

    init_from_env(timeout_s=30)
    res: dict = {}
    for name, (alg, oracle, params, schedule) in _cases().items():
        local = LocalCommunicator(schedule, dtype=D64)
        comm = DistributedCommunicator(schedule, dtype=D64)
        owned = comm.owned.tolist()
        ref = alg.init(params, oracle, local, keys=Keys.from_seed(5))
        shard_oracle = oracle.rows(owned)
        st = alg.init(comm.shard(params), shard_oracle, comm, keys=Keys.from_seed(5))
        for _ in range(STEPS):
            ref, _ = alg.step(ref, oracle, local)
            st, _ = alg.step(st, shard_oracle, comm)
        res[name] = {
            "owned": owned,
            "x": flatten(st.x),
            "w": st.w,
            "table": st.table,
            "mean": st.table_mean,
            "ref_x": flatten(ref.x),
            "ref_w": ref.w,
            "ref_table": ref.table,
            "ref_mean": ref.table_mean,
            "x0": flatten(params),
        }
    torch.save(res, Path(out) / f"rank{rank}.pt")


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_privsgp_matches_simulator(tmp_path, world, run_ranks):
    assert run_ranks(world, _worker, (str(tmp_path),)) == [0] * world
    seen: dict[str, list[int]] = {}
    for rank in range(world):
        res = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        for name, r in res.items():
            rows = torch.tensor(r["owned"])
            seen.setdefault(name, []).extend(r["owned"])
            torch.testing.assert_close(r["x"], r["ref_x"][rows], rtol=0, atol=1e-12)
            torch.testing.assert_close(r["w"], r["ref_w"][rows], rtol=0, atol=1e-12)
            if name.startswith("vr"):
                torch.testing.assert_close(r["table"], r["ref_table"][rows], rtol=0, atol=1e-12)
                torch.testing.assert_close(r["mean"], r["ref_mean"][rows], rtol=0, atol=1e-12)
            else:
                assert r["table"] is None and r["ref_table"] is None
            # the run moved (so equality is not trivially of the initial state)
            assert float((r["ref_x"] - r["x0"]).abs().max()) > 1e-3, name
    for name, owned in seen.items():
        assert sorted(owned) == list(range(N)), name  # the shards cover every node once


class _Holding(LocalCommunicator):
    """The simulator's communicator as a process holding the nodes ``held`` sees it at init."""

    def __init__(self, held: list[int]) -> None:
        super().__init__(ExponentialGraph(N), dtype=D64)
        self._held = torch.tensor(held)

    @property
    def owned(self) -> torch.Tensor:
        return self._held

    def shard(self, tree):
        return {k: v[self._held] for k, v in tree.items()}


def test_shard_init_refuses_mismatched_rows():
    from privdl.errors import ConfigError

    oracle = _least_squares()
    x0 = {"x": torch.zeros(N, 3, dtype=D64)}
    alg = PrivSGP(StepSize(0.1))
    with pytest.raises(ConfigError, match="oracle.rows"):
        alg.init({"x": x0["x"][:2]}, oracle, _Holding([0, 1]), keys=Keys.from_seed(0))
    with pytest.raises(ConfigError, match="2 rows but the communicator owns 3 nodes"):
        alg.init(
            {"x": x0["x"][:2]}, oracle.rows([0, 1]), _Holding([0, 1, 2]), keys=Keys.from_seed(0)
        )
