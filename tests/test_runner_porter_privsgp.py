"""The runner for PORTER-DP/GC and PrivSGP(-VR): calibration, labels, resume, sharded runs.

Oracles: DECOR's LDP table (docs/reproductions-decor.md) (PORTER-DP's noise is the same local Gaussian mechanism),
the classic RDP conversion in closed form, dp-accounting called directly, an uninterrupted run
(resume) and the single-process simulator (2 forked ranks over gloo).
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import socket
import traceback

import pytest
import torch

from privdl.errors import ConfigError, PrivdlError
from privdl.loop import build_run as build
from privdl.loop import resume, train
from privdl.records import RunRecords, merged_shards
from privdl.registry import make_config

LS = dict(
    task="least-squares",
    graph="ring:6",
    steps=40,
    lr=0.05,
    clip=1.0,
    eval_every=10,
    dtype="float64",
    seed=3,
)
CONFIGS = {
    "porter-dp": {"sigma": 0.3, "compressor": "randk:0.5", "gamma": 0.5},
    "porter-gc": {"compressor": "random:0.3", "gamma": 0.5},
    "privsgp": {"sigma": 0.2, "graph": "expo:6"},
    "privsgp-vr": {"sigma": 0.2, "graph": "expo:6"},
}


def bw_delta(mu: float, eps: float) -> float:
    """Balle and Wang (2018, Thm 8): the exact delta(eps) of a mu-GDP mechanism (scipy)."""
    from scipy.stats import norm

    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps + norm.logcdf(-eps / mu - mu / 2)))


def test_porter_dp_sigma_matches_decor_ldp_table():
    """PORTER-DP adds N(0, sigma_p^2) to each agent's clipped gradient: on the full-gradient least
    squares it is the LDP mechanism, so DECOR Fig 1a's (Section 6.1) sigma_ldp = 67.19 C (T = 3500, eps =
    10, delta = 1e-5) applies; Theorem 1's nominal formula does not (no sampling)."""
    values = {**LS, "graph": "ring:16", "steps": 3500, "algorithm": "porter-dp", "epsilon": 10.0}
    paper = build(make_config({**values, "accountant": "rdp"}))  # the table's classic conversion
    assert paper.cfg.sigma == pytest.approx(67.19, rel=1e-3)
    built = build(make_config(values))  # the exact default: less noise for the same guarantee
    assert 0.58 < (built.cfg.sigma / paper.cfg.sigma) ** 2 < 0.95
    assert built.algorithm.sigma_p == built.cfg.sigma and built.cfg.delta == 1e-5
    priv = built.privacy(3500)
    assert 10.0 * (1 - 1e-6) <= priv["epsilon"] <= 10.0
    assert priv["threat_model"] == "ldp" and priv["unit"] == "user"


def test_porter_defaults_and_gc_refusals():
    cfg = make_config({**LS, "algorithm": "porter-gc"})
    assert cfg.mixing == "fdla" and cfg.compressor == "none" and cfg.clip_mode == "batch_mean"
    assert make_config({**LS, "algorithm": "ldp"}).mixing == "metropolis"
    assert make_config({**LS, "algorithm": "porter-dp", "compressor": "random:0.1"}).compressor == (
        "randk:0.1"
    )
    with pytest.raises(ConfigError, match="porter-gc is non-private"):
        build(make_config({**LS, "algorithm": "porter-gc", "epsilon": 1.0}))
    with pytest.raises(ConfigError, match="no noise"):
        build(make_config({**LS, "algorithm": "porter-gc", "sigma": 0.1}))
    with pytest.raises(ConfigError, match="sigma > 0"):
        build(make_config({**LS, "algorithm": "porter-dp"}))
    # Definition 2: PORTER's clipping operator is smooth unless asked otherwise; D-SGD's is hard
    assert make_config({**LS, "algorithm": "porter-dp", "sigma": 0.1}).clip_kind == "smooth"
    assert make_config({**LS, "algorithm": "porter-gc"}).clip_kind == "smooth"
    assert make_config({**LS, "algorithm": "ldp", "sigma": 0.1}).clip_kind == "hard"
    hard = {**LS, "algorithm": "porter-dp", "sigma": 0.1, "clip_kind": "hard"}
    assert make_config(hard).clip_kind == "hard"
    assert build(make_config(hard)).algorithm.clip.kind == "hard"
    assert build(make_config({**hard, "clip_kind": None})).algorithm.clip.kind == "smooth"
    # option I clips each sample: a clipped minibatch mean is PORTER-GC's (option II)
    with pytest.raises(ConfigError, match="porter-dp clips each sample"):
        make_config({**LS, "task": "a9a", "algorithm": "porter-dp", "sigma": 0.1,
                     "clip_mode": "batch_mean"})  # fmt: skip


def test_privsgp_vr_epsilon_is_classic_gaussian_composition(tmp_path):
    """No amplification: T Gaussian steps are exactly mu-GDP, mu = sqrt(2 rho), rho = T D^2/(2
    sigma^2) with the replace-one sensitivity D = (4 - 2/J) C of g = h - T[xi] + mean(T); J = d =
    5 samples. The exact epsilon is below the classic rho + 2 sqrt(rho ln(1/delta))."""
    cfg = {**LS, "algorithm": "privsgp-vr", "graph": "expo:6", "ls_dim": 5, "epsilon": 4.0}
    summary = train(cfg, tmp_path / "r", progress=False)
    sigma, delta = summary["config"]["sigma"], summary["config"]["delta"]
    sens = (4.0 - 2.0 / 5) * 1.0
    rho = 40 * sens**2 / (2 * sigma**2)
    classic = rho + 2 * math.sqrt(rho * math.log(1 / delta))
    priv = summary["final"]["privacy"]
    mu = math.sqrt(2 * rho)
    assert bw_delta(mu, priv["epsilon"]) <= delta < bw_delta(mu, priv["epsilon"] * (1 - 1e-6))
    assert priv["epsilon"] < classic and priv["mu"] == pytest.approx(mu)
    assert 4.0 * (1 - 1e-6) <= priv["epsilon"] <= 4.0
    assert priv["accountant"] == "gaussian" and priv["unit"] == "example"
    assert priv["neighbouring"] == "replace_one" and priv["threat_model"] == "ldp"
    # the paper's formula and the Poisson approximation are recorded, labelled, never used
    cal = json.loads((tmp_path / "r" / "calibration.json").read_text())
    assert cal["accounted"]["sigma"] == sigma
    nominal = 3 * 1.0 * math.sqrt(40 * math.log(1 / delta)) / (5 * 4.0)  # eq. (11), c2 = 1
    assert cal["nominal"]["sigma"] == pytest.approx(nominal, rel=1e-12)
    assert cal["nominal"]["nominal"] and cal["subsampled_approximation"]["nominal"]
    assert summary["calibration"] == cal


def test_privsgp_epsilon_matches_dp_accounting(tmp_path):
    """PrivSGP draws one of J samples: dp-accounting's sampled-without-replacement Gaussian."""
    import dp_accounting as dpa

    cfg = {**LS, "algorithm": "privsgp", "graph": "ring:6", "sigma": 3.0, "eval_every": 40}
    summary = train(cfg, tmp_path / "r", progress=False)
    j, z = 10, 3.0 / 2.0  # J = ls_dim samples, noise multiplier at sensitivity 2C
    acc = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(
        dpa.SampledWithoutReplacementDpEvent(j, 1, dpa.GaussianDpEvent(z)),
        40,
    )
    priv = summary["final"]["privacy"]
    assert priv["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-2)
    # the tightest certified for fixed-size sampling is RDP (dp-accounting has no PLD for it)
    assert priv["accountant"] == "rdp" and priv["unit"] == "example"
    assert "no PLD for fixed-size" in priv["notes"]


def test_privsgp_record_is_capped_by_unsampled_steps(tmp_path):
    """At small noise, T steps of the unsampled Gaussian (sensitivity 2C/B: a replaced example
    moves its entry's mean by that) bound PrivSGP's epsilon more tightly than dp-accounting's
    one-of-J bound; the record takes the smaller, says so, and is never above either."""
    import dp_accounting as dpa

    cfg = {**LS, "algorithm": "privsgp", "graph": "ring:4", "sigma": 0.05, "steps": 10,
           "eval_every": 10}  # fmt: skip
    priv = train(cfg, tmp_path / "r", progress=False)["final"]["privacy"]
    j, sens = 10, 2.0  # J = 10 entries of one sample, sensitivity 2C
    rho = 10 * sens**2 / (2 * 0.05**2)
    classic = rho + 2 * math.sqrt(rho * math.log(1 / 1e-5))
    acc = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.SampledWithoutReplacementDpEvent(j, 1, dpa.GaussianDpEvent(0.05 / sens)), 10)
    assert classic < acc.get_epsilon(1e-5)
    # the cap is the exact epsilon of the unsampled steps (mu-GDP, mu = sqrt(2 rho))
    mu, e = math.sqrt(2 * rho), priv["epsilon"]
    assert bw_delta(mu, e) <= 1e-5 < bw_delta(mu, e * (1 - 1e-6)) and e < classic
    assert (
        priv["accountant"] == "gaussian-unsampled-cap"
        and "capped by the unsampled" in priv["notes"]
    )


@pytest.mark.parametrize("algorithm", sorted(CONFIGS))
def test_resume_is_bit_identical(tmp_path, algorithm):
    cfg = make_config({**LS, "algorithm": algorithm, **CONFIGS[algorithm]})
    full = train(cfg, tmp_path / "full", progress=False)
    part = train(cfg, tmp_path / "part", progress=False, stop_after=23)
    assert part == {"stopped_at": 23}
    saved = RunRecords(tmp_path / "part").load_checkpoint()
    assert saved["t"] == 20 and saved["state"]  # the full algorithm state is checkpointed
    resume(tmp_path / "part", progress=False)
    a = RunRecords(tmp_path / "full").load_checkpoint()
    b = RunRecords(tmp_path / "part").load_checkpoint()
    assert torch.equal(a["params"]["x"], b["params"]["x"])
    assert a["state"].keys() == b["state"].keys()
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key
    # epsilon neither reset nor double counted, no row lost or repeated
    assert _rows(tmp_path / "full") == _rows(tmp_path / "part")
    assert full["steps_done"] == 40


def _rows(run_dir) -> list[dict]:
    drop = ("wall_time", "timestamp")  # when: not what
    return [{k: v for k, v in r.items() if k not in drop} for r in RunRecords(run_dir).rows()]


def test_resume_restores_state_not_only_models(tmp_path):
    """Restarting PORTER from the models alone (surrogates and tracker reset) changes the run,
    so the bit-identical resume above really depends on the saved state."""
    from privdl.recipes.base import import_state

    cfg = make_config({**LS, "algorithm": "porter-dp", **CONFIGS["porter-dp"]})
    train(cfg, tmp_path / "part", progress=False, stop_after=20)
    ckpt = RunRecords(tmp_path / "part").load_checkpoint()
    built = build(cfg.with_updates(sigma=0.3), calibrated=True)
    fresh = built.init_state()
    good = import_state(fresh, ckpt["params"], ckpt["state"], t=20)
    bad = import_state(fresh, ckpt["params"], {}, t=20)
    a, _ = built.algorithm.step(good, built.oracle, built.comm)
    b, _ = built.algorithm.step(bad, built.oracle, built.comm)
    assert not torch.allclose(a.params["x"], b.params["x"])


def test_privsgp_vr_on_a9a_blocks_learns(tmp_path):
    """The supervised sample oracle (blocks of 64 per-sample-clipped gradients) trains a9a."""
    cfg = {
        "algorithm": "privsgp-vr",
        "task": "a9a",
        "graph": "expo:4",
        "steps": 30,
        "eval_every": 30,
        "lr": 0.5,
        "clip": 1.0,
        "sigma": 0.01,
        "block_size": 64,
    }
    summary = train(cfg, tmp_path / "r", progress=False)
    rows = list(RunRecords(tmp_path / "r").rows())
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.1
    assert "SAGA" in summary["final"]["privacy"]["notes"]


# ------------------------------------------------------------------ sharded (2 forked ranks)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(
    rank: int, world: int, port: int, cfg: dict, out: str, stop_after: int | None = None
) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    try:
        from privdl.distributed_runner import run_worker

        torch.set_num_threads(1)
        run_worker(cfg, out, timeout_s=60, progress=False, stop_after=stop_after)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


@pytest.mark.parametrize(
    "algorithm, extra",
    [
        ("porter-dp", {"sigma": 0.3, "compressor": "randk:0.5", "gamma": 0.5, "graph": "ring:5"}),
        ("privsgp-vr", {"sigma": 0.2, "graph": "expo:5"}),
    ],
)
def test_two_processes_equal_the_simulator(tmp_path, algorithm, extra):
    cfg = {**LS, "algorithm": algorithm, **extra, "steps": 20}
    ctx = mp.get_context("fork")
    port = _free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, 2, port, cfg, str(tmp_path / "dist")))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    train(cfg, tmp_path / "single", progress=False)
    a = merged_shards(tmp_path / "dist")  # each rank's own file, merged here
    b = RunRecords(tmp_path / "single").load_checkpoint()
    assert a["t"] == b["t"] == 20
    torch.testing.assert_close(a["params"]["x"], b["params"]["x"], rtol=0, atol=1e-12)
    assert a["state"].keys() == b["state"].keys()
    for key in a["state"]:
        torch.testing.assert_close(a["state"][key], b["state"][key], rtol=0, atol=1e-12)
    assert float((a["params"]["x"] - 1.0).abs().max()) > 1e-3  # the run moved
    ea = json.loads((tmp_path / "dist" / "summary.json").read_text())["final"]["privacy"]
    eb = json.loads((tmp_path / "single" / "summary.json").read_text())["final"]["privacy"]
    # the numbers are the simulator's; the label is an outsider's: every rank knows the seed
    label = ("threat_model", "notes", "rebuild")
    assert {k: v for k, v in ea.items() if k not in label} == {
        k: v for k, v in eb.items() if k not in label
    }
    assert (ea["threat_model"], eb["threat_model"]) == ("eavesdropper", "ldp")


def test_sharded_checkpoint_stays_with_its_rank(tmp_path):
    """A 2-process PrivSGP-VR run stopped at step 10: each rank's checkpoint holds its own
    nodes' x, w and SAGA table (un-noised gradients of their data), none is gathered, and one
    process cannot resume it (it would read every rank's data): one line naming the command
    (the resume itself: tests/comm/test_distributed_shards.py)."""
    cfg = {**LS, "algorithm": "privsgp-vr", "sigma": 0.2, "graph": "expo:5", "steps": 20}
    ctx = mp.get_context("fork")
    port = _free_port()
    args = [(r, 2, port, cfg, str(tmp_path / "dist"), 10) for r in range(2)]
    procs = [ctx.Process(target=_rank_main, args=a) for a in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    records = RunRecords(tmp_path / "dist")
    assert records.load_checkpoint() is None
    shards = {k: torch.load(f, weights_only=True) for k, f in records.shard_files().items()}
    assert set(shards) == {(0, 2, 10), (1, 2, 10)}
    assert [shards[(r, 2, 10)]["state"]["table"].shape[0] for r in (0, 1)] == [3, 2]
    with pytest.raises(PrivdlError, match="launched on 2 processes .* launch --nproc 2"):
        resume(tmp_path / "dist", progress=False)


def test_privsgp_one_entry_is_labelled_unsampled(tmp_path):
    """block_size = the node's samples leaves one table entry (J = 1): every step uses every
    sample, so the epsilon is the T-fold Gaussian's at replace-one sensitivity 2C/B: exact by
    default (label "gaussian", Balle and Wang's delta), below dp-accounting's RDP (written from
    scratch)."""
    import dp_accounting as dpa

    from privdl.accounting.dpsgd import RDP_ORDERS
    from privdl.tasks import build_task

    base = dict(algorithm="privsgp", task="a9a", graph="expo:4", steps=3, lr=0.1, clip=1.0,
                sigma=0.5, eval_every=3)  # fmt: skip
    b = int(build_task(make_config(base)).data.counts.min())
    summary = train({**base, "block_size": b}, tmp_path / "r", progress=False)
    acc = dpa.rdp.RdpAccountant(
        orders=RDP_ORDERS, neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE
    )  # the huge orders tiny noise needs
    acc.compose(dpa.GaussianDpEvent(0.5 / (2 * 1.0 / b)), 3)
    priv = summary["final"]["privacy"]
    mu, e = math.sqrt(3) / (0.5 / (2 * 1.0 / b)), priv["epsilon"]
    assert bw_delta(mu, e) <= 1e-5 and math.isclose(bw_delta(mu, e), 1e-5, rel_tol=1e-6)
    assert e < acc.get_epsilon(1e-5)
    assert priv["accountant"] == "gaussian" and "no subsampling" in priv["notes"]
