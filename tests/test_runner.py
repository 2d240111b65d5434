"""The runner: records, privacy labels, calibration and resume."""

import json
import math
import os
import re

import pytest
import torch

from privdl.errors import ConfigError, PrivdlError
from privdl.loop import resume, train
from privdl.records import RunRecords
from privdl.registry import make_config

LS = dict(
    task="least-squares",
    graph="ring:8",
    steps=60,
    lr=0.01,
    clip=1.0,
    clip_mode="batch_mean",
    eval_every=20,
    dtype="float64",
)


def test_records_layout_and_privacy_label(tmp_path):
    cfg = make_config({**LS, "algorithm": "ldp", "epsilon": 5.0, "delta": 1e-5})
    summary = train(cfg, tmp_path / "r", progress=False)
    files = {p.name for p in (tmp_path / "r").iterdir()}
    assert {
        "config.json",
        "environment.json",
        "metrics.jsonl",
        "summary.json",
        "checkpoint.pt",
    } <= files
    rows = [
        json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [0, 20, 40, 60]
    eps = [r["privacy"]["epsilon"] for r in rows]
    assert eps[0] == 0 and all(a < b for a, b in zip(eps, eps[1:], strict=False))
    final = summary["final"]["privacy"]
    # calibrated conservatively: the accounted total is at most the target, and close to it
    assert 5.0 * (1 - 1e-6) <= final["epsilon"] <= 5.0
    assert final["accountant"] == "secrdp+gaussian" and final["unit"] == "user"  # exact default
    assert final["mu"] > 0 and rows[1]["privacy"]["mu"] < final["mu"]
    assert final["threat_model"] == "ldp" and final["neighbouring"] == "replace_one"
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert saved["sigma"] > 0  # the resolved config carries the calibrated noise


def test_calibrated_ldp_sigma_matches_paper_table(tmp_path):
    """DECOR Fig 1a (Section 6.1; docs/reproductions-decor.md): T = 3500, eps = 10 gives sigma_ldp = 67.19 C with the paper's classic
    conversion (``accountant="rdp"``); CDP sigma_ldp / sqrt(n). The exact default needs less."""
    base = {**LS, "graph": "ring:16", "steps": 3500, "epsilon": 10.0, "delta": 1e-5}
    from privdl.loop import build_run as build

    ldp = build(make_config({**base, "algorithm": "ldp", "accountant": "rdp"})).cfg
    cdp = build(make_config({**base, "algorithm": "cdp", "accountant": "rdp"})).cfg
    assert ldp.sigma == pytest.approx(67.19, rel=1e-3)
    assert cdp.sigma == pytest.approx(67.19 / 4, rel=1e-3)
    exact = build(make_config({**base, "algorithm": "ldp"})).cfg
    assert 0.58 < (exact.sigma / ldp.sigma) ** 2 < 0.95


def test_decor_calibration_meets_target(tmp_path):
    cfg = make_config({**LS, "algorithm": "decor", "epsilon": 3.0, "delta": 1e-5})
    summary = train(cfg, tmp_path / "d", progress=False)
    c = summary["config"]
    assert c["sigma_cor"] > 0 and c["sigma"] > 0
    eps = summary["final"]["privacy"]["epsilon"]
    assert 3.0 * 0.999 <= eps <= 3.0
    assert summary["final"]["privacy"]["threat_model"] == "eavesdropper"


def test_decor_default_sigma_cdp_splits_the_step_budget_in_half():
    """Default sigma_cdp = sqrt(2) x the CDP level against an eavesdropper (Cor. 3's split):
    the sigma_cor -> infinity limit then uses exactly half of the step's RDP budget."""
    import math

    from privdl.accounting.secrdp import cdp_limit_step_rdp, decor_step_rdp
    from privdl.loop import build_run as build

    base = {**LS, "epsilon": 3.0, "delta": 1e-5}
    dec = build(make_config({**base, "algorithm": "decor"}))
    cdp = build(make_config({**base, "algorithm": "cdp"})).cfg
    assert dec.cfg.sigma == pytest.approx(math.sqrt(2.0) * cdp.sigma, rel=1e-6)
    g, c = dec.topology.graph, dec.cfg.clip
    full = decor_step_rdp(g, sigma_cdp=dec.cfg.sigma, sigma_cor=dec.cfg.sigma_cor, clip=c)
    limit = cdp_limit_step_rdp(g, sigma_cdp=dec.cfg.sigma, clip=c)
    assert limit == pytest.approx(full.step_rdp / 2.0, rel=1e-4)
    # colluders raise the admissible floor, and the default follows it: on the complete graph
    # G[H] keeps n - 2 nodes; on the ring two colluders can cut a node off (LDP noise, no sigma_cor)
    col = {**base, "algorithm": "decor", "adversary": "collusion:2"}
    k8 = build(make_config({**col, "graph": "complete:8"})).cfg
    cdp8 = build(make_config({**base, "algorithm": "cdp", "graph": "complete:8"})).cfg
    assert k8.sigma == pytest.approx(math.sqrt(2.0 * 8 / 6) * cdp8.sigma, rel=1e-6)
    assert k8.sigma_cor > 0
    from privdl.accounting import PrivacyWarning

    with pytest.warns(PrivacyWarning, match="cut a node off"):  # and says so
        ring = build(make_config(col)).cfg
    ldp = build(make_config({**base, "algorithm": "ldp"})).cfg
    assert ring.sigma == pytest.approx(ldp.sigma, rel=1e-6)
    assert ring.sigma_cor == 0.0


@pytest.mark.parametrize("algorithm", ["dsgd", "decor"])
def test_resume_is_bit_identical(tmp_path, algorithm):
    extra = {"sigma": 0.5, "sigma_cor": 2.0} if algorithm == "decor" else {}
    cfg = make_config({**LS, "algorithm": algorithm, **extra})
    full = train(cfg, tmp_path / "full", progress=False)
    part = train(cfg, tmp_path / "part", progress=False, stop_after=33)
    assert part == {"stopped_at": 33}
    assert not (tmp_path / "part" / "summary.json").exists()  # nothing looks complete
    resumed = resume(tmp_path / "part", progress=False)
    a = RunRecords(tmp_path / "full").load_checkpoint()["params"]["x"]
    b = RunRecords(tmp_path / "part").load_checkpoint()["params"]["x"]
    assert torch.equal(a, b)
    steps_full = [r["step"] for r in RunRecords(tmp_path / "full").rows()]
    steps_part = [r["step"] for r in RunRecords(tmp_path / "part").rows()]
    assert steps_full == steps_part  # no row lost, none written twice
    assert resumed["final"]["optimality_gap"] == full["final"]["optimality_gap"]


@pytest.mark.parametrize("crash", ["torn_last_row", "row_after_checkpoint_lost"])
def test_resume_after_a_crash_mid_record_loses_no_row(tmp_path, crash):
    """A crash tearing the last metrics line, or falling between the checkpoint and its row:
    resuming lost that row for good (and, torn, glued the next row onto the fragment)."""
    cfg = make_config({**LS, "algorithm": "ldp", "sigma": 0.5})
    full = train(cfg, tmp_path / "full", progress=False)
    train(cfg, tmp_path / "part", progress=False, stop_after=40)  # checkpoint and row at 40
    path = tmp_path / "part" / "metrics.jsonl"
    text = path.read_text()
    last = text.splitlines(keepends=True)[-1]
    assert json.loads(last)["step"] == 40
    kept = text[: len(text) - len(last)]
    path.write_text(kept + (last[:25] if crash == "torn_last_row" else ""))
    resumed = resume(tmp_path / "part", progress=False)
    records, bad = RunRecords(tmp_path / "part").read_rows()
    assert bad == (1 if crash == "torn_last_row" else 0)  # the fragment, kept (append-only)
    rows_full = list(RunRecords(tmp_path / "full").rows())
    strip = lambda r: {k: v for k, v in r.items() if k not in ("wall_time", "timestamp")}  # noqa: E731
    assert [strip(r) for r in records] == [strip(r) for r in rows_full]
    assert path.read_text().startswith(kept)
    assert resumed["final"]["optimality_gap"] == full["final"]["optimality_gap"]


def test_a_diverged_run_stays_an_error_when_resumed(tmp_path):
    cfg = make_config(
        {"task": "least-squares", "graph": "ring:4", "steps": 60, "eval_every": 20, "lr": 50.0}
    )
    with pytest.raises(PrivdlError, match="diverged at step 20"):
        train(cfg, tmp_path / "d", progress=False)
    with pytest.raises(PrivdlError, match="diverged at step 20"):
        resume(tmp_path / "d", progress=False)


def test_a_run_directory_has_one_writer(tmp_path):
    """While a process writes a run (holds its lock), a second run or resume there is refused
    and writes nothing; once the lock is released the resume goes through."""
    cfg = make_config({**LS, "algorithm": "dsgd", "clip": None, "clip_mode": "none"})
    train(cfg, tmp_path / "x", progress=False, stop_after=20)
    before = (tmp_path / "x" / "metrics.jsonl").read_bytes()
    records = RunRecords(tmp_path / "x")
    with records.exclusive():
        with pytest.raises(PrivdlError, match=rf"another privdl process \(pid {os.getpid()}\)"):
            resume(tmp_path / "x", progress=False)
        with pytest.raises(PrivdlError, match="another privdl process"):
            train(cfg, tmp_path / "x", progress=False, overwrite=True)
    assert (tmp_path / "x" / "metrics.jsonl").read_bytes() == before
    assert resume(tmp_path / "x", progress=False)["steps_done"] == cfg.steps


def test_refuses_to_overwrite_an_earlier_run(tmp_path):
    cfg = make_config({**LS, "algorithm": "dsgd", "clip": None, "clip_mode": "none", "steps": 5})
    train(cfg, tmp_path / "x", progress=False)
    with pytest.raises(PrivdlError, match="already holds a run"):
        train(cfg, tmp_path / "x", progress=False)
    # an overwrite leaves nothing of the earlier run, a launched run's rank key files included
    (tmp_path / "x" / "keys").mkdir()
    (tmp_path / "x" / "keys" / "rank-0.pt").write_bytes(b"secret")
    train(cfg, tmp_path / "x", progress=False, overwrite=True)
    assert not (tmp_path / "x" / "keys").exists()


@pytest.mark.parametrize(
    ("values", "msg"),
    [
        ({"algorithm": "ldp", "sigma": 0.0}, "sigma"),
        ({"algorithm": "ldp", "clip": None, "clip_mode": "none", "sigma": 1.0}, "clipping"),
        ({"algorithm": "dsgd", "sigma": 1.0}, "non-private"),
        ({"algorithm": "ldp", "epsilon": 1.0, "sigma": 1.0}, "either"),
    ],
)
def test_inconsistent_configs(tmp_path, values, msg):
    with pytest.raises(ConfigError, match=msg):
        train(make_config({**LS, **values}), tmp_path / "bad", progress=False)
    assert not (tmp_path / "bad" / "summary.json").exists()


@pytest.mark.parametrize(
    ("values", "msg"),
    [
        ({"bogus": 1}, "unknown config key"),
        ({"lr": -1.0}, "lr"),
        ({"steps": 0}, "steps"),
        ({"delta": 2.0}, "delta"),
        ({"partition": "dirichlet:-1"}, "partition"),
        ({"clip": float("nan")}, "clip"),
        ({"noise_backend": "philox"}, "noise_backend"),
        ({"task": "least-squares", "model": "mlp"}, "drop model"),
        ({"task": "least-squares", "partition": "dirichlet:0.5"}, "drop partition"),
        ({"task": "least-squares", "sampling": "poisson"}, "drop sampling"),
        ({"task": "a9a", "ls_dim": 5}, "ls_dim is least-squares"),
        ({"device": "tpu"}, "cpu, cuda or cuda:N"),
        (
            {"algorithm": "ldp", "sigma": 1.0, "adversary": "curious"},
            "adversary applies to correlated noise",
        ),
        ({"algorithm": "ldp", "sigma": 1.0, "delta": 1.0}, "delta"),
        ({"algorithm": "ldp", "epsilon": float("inf")}, "epsilon"),
        ({"algorithm": "ldp", "sigma": float("nan")}, "sigma"),
        ({"algorithm": "ldp", "sigma": 1.0, "lr": float("inf")}, "lr"),
        ({"algorithm": "porter-gc", "clip_mode": "per_sample"}, "porter-gc clips the minibatch"),
        ({"algorithm": "ldp", "sigma": 1.0, "block_size": 4}, "block_size applies"),
    ],
)
def test_config_validation(values, msg):
    with pytest.raises(ConfigError, match=msg):
        make_config({**LS, **values})


def test_noise_backend_is_resolved_saved_and_kept_on_resume(tmp_path):
    """'auto' is resolved from the device once and saved; resuming a run that was started with
    another backend keeps that backend (the streams a resumed run draws must be the same)."""
    base = {**LS, "algorithm": "decor", "sigma": 0.5, "sigma_cor": 2.0, "steps": 20}
    auto = train(make_config(base), tmp_path / "auto", progress=False)
    saved = json.loads((tmp_path / "auto" / "config.json").read_text())
    assert saved["noise_backend"] == "aes-ziggurat"  # CPU
    chacha = train(
        make_config({**base, "noise_backend": "chacha20"}), tmp_path / "chacha", progress=False
    )
    assert json.loads((tmp_path / "chacha" / "config.json").read_text())["noise_backend"] == (
        "chacha20"
    )
    assert auto["final"]["optimality_gap"] != chacha["final"]["optimality_gap"]  # other streams
    cfg = make_config({**base, "noise_backend": "chacha20"})
    assert train(cfg, tmp_path / "part", progress=False, stop_after=7) == {"stopped_at": 7}
    resumed = resume(tmp_path / "part", progress=False)
    assert resumed["final"]["optimality_gap"] == chacha["final"]["optimality_gap"]


def test_a_run_saved_before_noise_backend_existed_resumes_with_chacha20(tmp_path):
    """Runs written before the field existed drew ChaCha20 streams; resuming one must too."""
    cfg = make_config(
        {**LS, "algorithm": "ldp", "sigma": 0.5, "steps": 20, "noise_backend": "chacha20"}
    )
    full = train(cfg, tmp_path / "full", progress=False)
    assert train(cfg, tmp_path / "old", progress=False, stop_after=9) == {"stopped_at": 9}
    path = tmp_path / "old" / "config.json"
    saved = json.loads(path.read_text())
    del saved["noise_backend"]  # what a run written by an earlier privdl looks like
    path.write_text(json.dumps(saved))
    resumed = resume(tmp_path / "old", progress=False)
    assert resumed["final"]["optimality_gap"] == full["final"]["optimality_gap"]


def test_a_diverging_run_stops_with_a_clear_error_and_says_so_in_its_records(tmp_path):
    cfg = make_config({**LS, "algorithm": "dsgd", "clip": None, "clip_mode": "none",
                       "lr": 1e3, "eval_every": 10, "steps": 200})  # fmt: skip
    with pytest.raises(PrivdlError, match=r"training diverged at step (\d+)") as err:
        train(cfg, tmp_path / "d", progress=False)
    summary = RunRecords(tmp_path / "d").summary()
    assert summary["final"]["diverged"] is True and summary["completed"] is False
    step = int(re.search(r"step (\d+)", str(err.value))[1])
    assert summary["steps_done"] == summary["final"]["step"] == step < cfg.steps


def test_progress_note_shows_the_epsilon_spent_and_flags_nominal():
    from privdl.loop import short_info as _short

    budget = {"epsilon": 1.23456, "delta": 1e-5, "unit": "example", "threat_model": "ldp"}
    row = {"loss": 0.5, "accuracy": 0.75, "privacy": {**budget, "nominal": False}}
    assert _short(row) == "loss=0.5 accuracy=0.75 eps=1.23 (delta=1e-05, example, ldp)"
    row["privacy"]["nominal"] = True
    assert _short(row).endswith("eps=1.23 NOMINAL (delta=1e-05, example, ldp)")
    assert _short({"loss": 0.5}) == "loss=0.5"


def test_porter_default_mixing_is_fdla_on_small_graphs_and_best_constant_on_large():
    from privdl.recipes.porter import FDLA_DEFAULT_MAX_NODES

    small = make_config({"algorithm": "porter-dp", "graph": "ring:16"})
    large = make_config({"algorithm": "porter-dp", "graph": f"ring:{FDLA_DEFAULT_MAX_NODES + 1}"})
    chosen = make_config({"algorithm": "porter-dp", "graph": "ring:300", "mixing": "fdla"})
    assert (small.mixing, large.mixing, chosen.mixing) == ("fdla", "best-constant", "fdla")
    assert make_config({"algorithm": "decor", "graph": "ring:300"}).mixing == "metropolis"


@pytest.mark.parametrize("algorithm", ["decor", "ldp"])
def test_os_keys_are_not_the_seeds_and_a_resumed_run_keeps_them(tmp_path, algorithm):
    """key_source=os: the noise keys (and DECOR's edge secrets) come from the OS, so two runs
    with one seed differ; the checkpoint holds them, so two resumptions of one checkpoint agree
    to the bit (had the keys been drawn afresh on resume, they would not)."""
    import shutil

    from privdl.mechanisms.secrets import agree_edge_secrets, node_noise_keys

    extra = {"sigma_cor": 2.0} if algorithm == "decor" else {}
    cfg = make_config({**LS, "algorithm": algorithm, "sigma": 0.5, "steps": 20, **extra,
                       "key_source": "os", "eval_every": 5})  # fmt: skip
    a = train(cfg, tmp_path / "a", progress=False)
    b = train(cfg, tmp_path / "b", progress=False)
    assert a["final"]["optimality_gap"] != b["final"]["optimality_gap"]
    assert "noise keys and data sampling from OS randomness" in a["final"]["privacy"]["notes"]
    seeded = train(cfg.with_updates(key_source="seed"), tmp_path / "s", progress=False)
    assert "keys from the seed" in seeded["final"]["privacy"]["notes"]

    assert train(cfg, tmp_path / "p1", progress=False, stop_after=12) == {"stopped_at": 12}
    keys = RunRecords(tmp_path / "p1").load_checkpoint()["keys"]
    n = int(LS["graph"].split(":")[1])
    assert set(keys["noise_keys"]).isdisjoint(node_noise_keys(range(n), seed=cfg.seed))
    if algorithm == "decor":
        from privdl.topology import parse_graph

        from_seed = agree_edge_secrets(parse_graph(LS["graph"]).edges, n, seed=cfg.seed)
        assert len(keys["edge_keys"]) == n and set(keys["edge_keys"]).isdisjoint(
            from_seed.edge_keys()
        )
    shutil.copytree(tmp_path / "p1", tmp_path / "p2")
    r1 = resume(tmp_path / "p1", progress=False)
    r2 = resume(tmp_path / "p2", progress=False)
    drop = {"wall_time"}
    assert r1["steps_done"] == 20 and r1["final"]["optimality_gap"] > 0
    assert {k: v for k, v in r1["final"].items() if k not in drop} == {
        k: v for k, v in r2["final"].items() if k not in drop
    }


def test_os_keys_single_process_resume_errors_say_what_is_missing(tmp_path):
    """A checkpoint without its keys (or a launched run's, whose keys each rank kept) cannot
    resume a key_source=os run: one line that says so."""
    cfg = make_config({**LS, "algorithm": "ldp", "sigma": 0.5, "steps": 20, "key_source": "os",
                       "eval_every": 5})  # fmt: skip
    assert train(cfg, tmp_path / "r", progress=False, stop_after=7) == {"stopped_at": 7}
    path = RunRecords(tmp_path / "r").checkpoint_path
    ckpt = torch.load(path, weights_only=False)
    del ckpt["keys"]
    torch.save(ckpt, path)
    with pytest.raises(PrivdlError, match="holds no keys: the run cannot be resumed"):
        resume(tmp_path / "r", progress=False)
    ckpt["key_run_id"] = "0f" * 16  # as a launched run's gathered checkpoint
    torch.save(ckpt, path)
    with pytest.raises(PrivdlError, match="resume it with privdl launch --resume"):
        resume(tmp_path / "r", progress=False)


def test_os_keys_draw_the_data_sampling_too(tmp_path):
    """Subsampling amplification assumes the batches drawn are secret: under key_source=os the
    minibatch seed (and PrivSGP's xi seed) come from the OS, the checkpoint keeps it, and a
    resumed run draws the same batches (two resumptions of one checkpoint agree to the bit)."""
    import shutil

    from privdl.loop import LocalWorld
    from privdl.loop import build_run as build

    a9a = {"task": "a9a", "graph": "ring:4", "steps": 12, "eval_every": 4, "lr": 0.1,
           "clip": 1.0, "batch_size": 8, "algorithm": "ldp", "sigma": 0.5, "seed": 3,
           "key_source": "os"}  # fmt: skip
    cfg = make_config(a9a)
    seeds = set()
    for _ in range(2):
        built = build(cfg, calibrated=True)
        LocalWorld().os_state(built, tmp_path, None)
        seeds.add(built.task.seed)
    assert len(seeds) == 2 and cfg.seed not in seeds
    sgp = build(make_config({**LS, "algorithm": "privsgp", "graph": "expo:4", "sigma": 0.2, "clip_mode": "per_sample",
                             "key_source": "os"}), calibrated=True)  # fmt: skip
    assert LocalWorld().os_state(sgp, tmp_path, None).seed != LS.get("seed", 0)

    assert train(cfg, tmp_path / "p1", progress=False, stop_after=6) == {"stopped_at": 6}
    saved = RunRecords(tmp_path / "p1").load_checkpoint()["keys"]["sampling_seed"]
    assert saved != cfg.seed
    shutil.copytree(tmp_path / "p1", tmp_path / "p2")
    r1, r2 = (resume(tmp_path / p, progress=False) for p in ("p1", "p2"))
    drop = {"wall_time"}
    assert {k: v for k, v in r1["final"].items() if k not in drop} == {
        k: v for k, v in r2["final"].items() if k not in drop
    }


def test_federated_os_key_source_seeds_the_clients_generator_from_the_os(tmp_path):
    """key_source=os in a federated run: each client's noise and batches come from its own OS key
    (participation from an OS-seeded generator), so two runs with one seed differ while the model's initialisation does
    not; the checkpoint holds the generator's state, so two resumptions agree to the bit."""
    import shutil

    # batch 512: 16 local steps a round; RDP: the key source, not the accountant, is tested here
    base = {"algorithm": "dpfedavg", "task": "a9a", "clients": 4, "batch_size": 512, "lr": 0.05,
            "clip": 1.0, "epsilon": 2.0, "steps": 4, "eval_every": 2, "key_source": "os",
            "accountant": "rdp"}  # fmt: skip
    a = train(make_config(base), tmp_path / "a", progress=False)
    b = train(make_config(base), tmp_path / "b", progress=False)
    assert a["final"]["loss"] != b["final"]["loss"]
    first = [next(iter(RunRecords(tmp_path / r).rows()))["loss"] for r in ("a", "b")]
    assert first[0] == first[1]  # step 0: the same seeded initial model
    notes = a["final"]["privacy"]["notes"]  # each client's own key (issue 29), one process
    assert "own OS key; one process runs every client and the server here" in notes
    assert a["final"]["privacy"]["threat_model"] == "server"
    s = train(make_config({**base, "key_source": "seed"}), tmp_path / "s", progress=False)
    assert "noise and sampling from the seed" in s["final"]["privacy"]["notes"]
    assert train(make_config(base), tmp_path / "p1", progress=False, stop_after=2) == {
        "stopped_at": 2
    }
    shutil.copytree(tmp_path / "p1", tmp_path / "p2")
    r1, r2 = (resume(tmp_path / p, progress=False) for p in ("p1", "p2"))
    assert r1["final"]["loss"] == r2["final"]["loss"]


def test_example_level_record_never_exceeds_the_unsampled_user_level_epsilon(tmp_path):
    """b = 1, tiny noise: the run's example-level epsilon is capped by the unsampled Gaussian's
    (closed form: slope 2 C^2 / sigma^2, T-fold, classic conversion) and says so."""
    from privdl.accounting.conversion import compose_convert

    cfg = make_config(
        dict(algorithm="ldp", task="a9a", graph="ring:4", steps=4, lr=0.1, clip=1.0, sigma=0.05,
             batch_size=1, eval_every=2, clip_mode="per_sample")
    )  # fmt: skip
    final = train(cfg, tmp_path / "r", progress=False)["final"]["privacy"]
    user = compose_convert(2 * 1.0 / 0.05**2, steps=4, delta=final["delta"])
    assert final["unit"] == "example" and final["epsilon"] == pytest.approx(user)
    assert "capped by the unsampled" in final["notes"]


def test_example_level_accounting_uses_the_smallest_node_and_c_over_b(tmp_path):
    """Unequal partition (Dirichlet): each node samples B of its own m_i records, so the
    worst-off node (smallest m_i, largest rate) sets the guarantee. Oracle: dp-accounting's RDP
    of the LDP step written from scratch: Gaussian of std sigma at replace-one sensitivity
    2C/B, B of m_min drawn without replacement, T steps. Also pins the calibration to target."""
    import dp_accounting as dpa
    from dp_accounting import rdp

    from privdl.accounting.dpsgd import RDP_ORDERS
    from privdl.tasks import build_task

    cfg = make_config(
        dict(algorithm="ldp", task="a9a", graph="ring:4", steps=20, lr=0.1, clip=1.0,
             epsilon=3.0, delta=1e-5, batch_size=16, clip_mode="per_sample",
             partition="dirichlet:5", eval_every=10)
    )  # fmt: skip
    counts = build_task(cfg).data.counts
    assert counts.max() > 1.2 * counts.min()  # a real imbalance
    summary = train(cfg, tmp_path / "r", progress=False)
    final, sigma = summary["final"]["privacy"], summary["config"]["sigma"]
    assert final["unit"] == "example" and 3.0 * 0.999 <= final["epsilon"] <= 3.0

    def oracle(m: int) -> float:
        acc = rdp.RdpAccountant(
            orders=RDP_ORDERS, neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE
        )
        z = sigma / (2 * 1.0 / 16)
        event = dpa.SampledWithoutReplacementDpEvent(m, 16, dpa.GaussianDpEvent(z))
        acc.compose(dpa.SelfComposedDpEvent(event, 20))
        return acc.get_epsilon(1e-5)

    assert final["epsilon"] == pytest.approx(oracle(int(counts.min())), rel=1e-9)
    assert oracle(int(counts.max())) < 0.95 * final["epsilon"]  # the largest node's is lower


def test_cdp_step_rdp_is_the_central_gaussian():
    """CDP (complete graph, W = J): the average of n clipped gradients (one user moves it by at
    most 2C/n) plus the average of n noises of std sigma (std sigma/sqrt(n)): the replace-one
    slope is (2C/n)^2 / (2 sigma^2/n) = 2C^2 / (n sigma^2)."""
    from privdl.registry import recipe_for
    from privdl.tasks import build_task
    from privdl.topology import parse_graph

    cfg = make_config({**LS, "algorithm": "cdp", "graph": "complete:8", "sigma": 0.7})
    rho = recipe_for(cfg).step_rdp(cfg, parse_graph("complete:8"), build_task(cfg), sigma=0.7)
    assert rho == pytest.approx(2 * 1.0**2 / (8 * 0.7**2), rel=1e-12)


def test_a_run_cut_off_before_its_summary_is_not_overwritten_by_a_fresh_start(tmp_path):
    """An interrupted run (rows written, no summary.json) is kept: a fresh start is refused
    and points at --resume, like a finished one."""
    cfg = make_config({**LS, "algorithm": "dsgd", "clip": None, "clip_mode": "none", "steps": 40})
    assert train(cfg, tmp_path / "x", progress=False, stop_after=20) == {"stopped_at": 20}
    assert not (tmp_path / "x" / "summary.json").exists()
    before = (tmp_path / "x" / "metrics.jsonl").read_bytes()
    with pytest.raises(PrivdlError, match="--resume"):
        train(cfg, tmp_path / "x", progress=False)
    assert (tmp_path / "x" / "metrics.jsonl").read_bytes() == before


def test_the_last_step_is_evaluated_and_recorded_off_the_eval_grid(tmp_path):
    """steps = 7 with eval_every = 5: rows at 0, 5 and the final 7, and the checkpoint at 7."""
    cfg = make_config({**LS, "algorithm": "dsgd", "clip": None, "clip_mode": "none", "steps": 7,
                       "eval_every": 5})  # fmt: skip
    summary = train(cfg, tmp_path / "r", progress=False)
    records = RunRecords(tmp_path / "r")
    assert [r["step"] for r in records.rows()] == [0, 5, 7]
    assert records.load_checkpoint()["t"] == 7 and summary["final"]["step"] == 7


def test_step_size_and_consensus_distance_closed_forms():
    """eta_t = lr / (1 + t / decay); consensus distance (1/n) sum_i ||x_i - xbar||^2 over all
    leaves, against a Python loop."""
    from privdl.algorithms.base import StepSize, consensus_distance

    assert [StepSize(0.2, decay=50)(t) for t in (0, 50, 150)] == pytest.approx([0.2, 0.1, 0.05])
    assert StepSize(0.3)(10_000) == 0.3
    tree = {"x": torch.tensor([[0.0, 0.0], [2.0, 0.0]]), "y": torch.tensor([[1.0], [3.0]])}
    assert consensus_distance(tree) == pytest.approx(2.0)
    g = torch.Generator().manual_seed(0)
    tree = {"a": torch.randn(5, 3, 2, generator=g, dtype=torch.float64),
            "b": torch.randn(5, 4, generator=g, dtype=torch.float64)}  # fmt: skip
    loop = 0.0
    for v in tree.values():
        flat = v.reshape(5, -1)
        mean = sum(flat[i] for i in range(5)) / 5
        loop += sum(float(((flat[i] - mean) ** 2).sum()) for i in range(5)) / 5
    assert consensus_distance(tree) == pytest.approx(loop, rel=1e-12)


def test_full_batch_example_level_run_is_labelled_unsampled(tmp_path):
    """batch = every example of the node: no subsampling amplification, so the label names the
    plain accountant (not "rdp-subsampled") and the epsilon is the T-fold Gaussian's: exact by
    default (mu-GDP, mu = sqrt(T)/z: Balle and Wang's delta(eps)); with ``accountant="rdp"``
    dp-accounting's (written from scratch) at replace-one sensitivity 2C/B."""
    import dp_accounting as dpa
    from dp_accounting import rdp
    from scipy.stats import norm

    from privdl.accounting.dpsgd import RDP_ORDERS
    from privdl.tasks import build_task

    probe = make_config(dict(algorithm="ldp", task="a9a", graph="ring:8", steps=2, sigma=0.5))
    m = int(build_task(probe).data.counts.min())
    values = dict(algorithm="ldp", task="a9a", graph="ring:8", steps=2, lr=0.1, clip=1.0,
                  sigma=0.5, batch_size=m, eval_every=1, clip_mode="per_sample")  # fmt: skip
    exact = train(make_config(values), tmp_path / "x", progress=False)["final"]["privacy"]
    mu, e = math.sqrt(2) / (0.5 / (2 * 1.0 / m)), exact["epsilon"]
    bw = norm.cdf(-e / mu + mu / 2) - math.exp(e + norm.logcdf(-e / mu - mu / 2))
    assert bw <= exact["delta"] and math.isclose(bw, exact["delta"], rel_tol=1e-6)
    assert exact["accountant"] == "secrdp+gaussian" and exact["mu"] == pytest.approx(mu)
    cfg = make_config({**values, "accountant": "rdp"})
    final = train(cfg, tmp_path / "r", progress=False)["final"]["privacy"]
    assert exact["epsilon"] < final["epsilon"]
    acc = rdp.RdpAccountant(
        orders=RDP_ORDERS, neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE
    )
    acc.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(0.5 / (2 * 1.0 / m)), 2))
    assert final["epsilon"] == pytest.approx(acc.get_epsilon(final["delta"]), rel=1e-9)
    assert final["accountant"] == "secrdp+rdp" and "full batch" in final["notes"]
    assert final["unit"] == "example" and final["neighbouring"] == "replace_one"


def test_a_run_saved_before_the_accountant_choice_resumes_with_its_old_accounting(tmp_path):
    """privdl 0.1 wrote no ``accountant`` into config.json and accounted with RDP + the classic
    conversion; resuming such a run must not switch its records to the exact default midway."""
    from privdl.registry import make_config as validate

    values = {**LS, "algorithm": "ldp", "epsilon": 5.0, "delta": 1e-5, "accountant": "rdp"}
    part = train(make_config(values), tmp_path / "r", progress=False, stop_after=30)
    assert part == {"stopped_at": 30}
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    del saved["accountant"]  # as privdl 0.1 wrote it
    (tmp_path / "r" / "config.json").write_text(json.dumps(saved))
    assert validate(saved, saved=True).accountant == "rdp"
    assert make_config({k: v for k, v in values.items() if k != "accountant"}).accountant == (
        "tightest"
    )  # a new run gets the default
    final = resume(tmp_path / "r", progress=False)["final"]["privacy"]
    assert final["accountant"] == "secrdp+classic" and final["epsilon"] <= 5.0


def test_a_bounded_step_rdp_is_labelled_in_the_run_record(tmp_path, monkeypatch):
    """Where the SecRDP accountant returns the certified upper bound ``gauss-radau:K`` (large
    graphs without symmetry; here its thresholds are lowered to 150 nodes), the run's privacy
    record says so, and its epsilon is at least the exact one (the dense path, same run)."""
    import functools

    import privdl.privacy
    from privdl.accounting.secrdp import decor_step_rdp

    cfg = {
        **LS, "algorithm": "decor", "graph": "regular:200:6:1", "steps": 4, "eval_every": 4,
        "sigma": 1.0, "sigma_cor": 5.0,
    }  # fmt: skip
    exact = train(make_config(cfg), tmp_path / "exact", progress=False)["final"]["privacy"]
    monkeypatch.setattr(
        privdl.privacy,
        "decor_step_rdp",
        functools.partial(decor_step_rdp, dense_limit=100, radau_min_nodes=150),
    )
    bound = train(make_config(cfg), tmp_path / "bound", progress=False)["final"]["privacy"]
    assert "bounded from above (gauss-radau:6" in bound["notes"]
    assert "bounded" not in exact["notes"]
    assert exact["epsilon"] <= bound["epsilon"] <= 1.05 * exact["epsilon"]
    assert bound["accountant"] == exact["accountant"] == "secrdp+gaussian"
