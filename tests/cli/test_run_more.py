"""``privdl run`` / ``privdl report`` for PORTER-DP, PORTER-GC, PrivSGP and PrivSGP-VR."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from privdl.cli.main import main

TINY = ["--task", "least-squares", "--steps", "20", "--eval-every", "10", "--clip", "1",
        "--dtype", "float64", "--no-progress"]  # fmt: skip


@pytest.mark.parametrize(
    "argv, private",
    [
        (["porter-dp", "--graph", "ring:6", "--epsilon", "5", "--compressor", "random:0.5"], True),
        (["porter-gc", "--graph", "ring:6", "--sigma", "0", "--gamma", "0.5"], False),
        (["privsgp", "--graph", "ring:6", "--sigma", "2"], True),
        (["privsgp-vr", "--graph", "expo:6", "--epsilon", "8", "--delta", "1e-5"], True),
    ],
)
def test_run_and_report(argv, private, tmp_path, capsys):
    out = tmp_path / argv[0]
    assert main(["run", *argv, *TINY, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] and summary["config"]["algorithm"] == argv[0]
    priv = summary["final"].get("privacy")
    if not private:
        assert priv is None and "privacy: non-private" in text
    else:
        label = f"{priv['accountant']}, ldp, {priv['unit']}-level, {priv['neighbouring']}"
        assert label in text and f"delta={priv['delta']}" in text
        if "--epsilon" in argv:
            target = float(argv[argv.index("--epsilon") + 1])
            assert target * (1 - 1e-6) <= priv["epsilon"] <= target
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0
    report = capsys.readouterr().out
    assert argv[0] in report and ("non-private" in report) == (not private)


def test_nominal_sigma_is_printed_and_labelled(tmp_path, capsys):
    out = tmp_path / "v"
    assert main(["run", "privsgp-vr", "--graph", "expo:4", "--epsilon", "2", *TINY,
                 "--out", str(out)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "sigma (accounted, gaussian)" in text  # exact: mu-GDP
    assert "sigma (nominal, NOMINAL, nominal:privsgp-thm2)" in text
    cfg = json.loads((out / "config.json").read_text())
    cal = json.loads((out / "calibration.json").read_text())
    assert cfg["sigma"] == cal["accounted"]["sigma"] != cal["nominal"]["sigma"]


@pytest.mark.parametrize(
    "argv",
    [
        ["porter-gc", "--graph", "ring:6", "--epsilon", "1"],
        ["porter-gc", "--graph", "ring:6", "--sigma", "0.5"],
        ["porter-dp", "--graph", "ring:6"],
        ["porter-dp", "--graph", "expo:6", "--sigma", "1"],
        ["porter-dp", "--graph", "ring:6", "--sigma", "1", "--compressor", "bogus:1"],
        ["porter-dp", "--graph", "ring:6", "--sigma", "1", "--gamma", "2"],
        ["privsgp", "--graph", "ring:6", "--compressor", "randk:0.5"],
        ["privsgp-vr", "--graph", "expo:6", "--block-size", "2"],
        ["privsgp", "--graph", "ring:6", "--clip-mode", "batch_mean"],
        ["ldp", "--graph", "ring:6", "--sigma", "1", "--gamma", "0.5"],
        ["privsgp-vr", "--graph", "expo:6", "--epsilon", "1", "--sigma", "1"],
        ["dsgd", "--graph", "ring:6", "--device", "tpu"],
        # click's own usage errors: unknown option, bad type, unknown algorithm
        ["dsgd", "--graph", "ring:6", "--stepz", "3"],
        ["dsgd", "--graph", "ring:6", "--lr", "abc"],
        ["sgd", "--graph", "ring:6"],
    ],
)
def test_bad_options_exit_2_with_one_line(argv, tmp_path, capsys):
    rc = main(["run", *argv, *TINY, "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    assert not (tmp_path / "o" / "summary.json").exists()


@pytest.mark.parametrize("argv", [["report"], ["graph"], ["nosuch"], ["account", "dpsgd"]])
def test_usage_errors_are_one_line_naming_the_help(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "--help" in err[0], err


def test_resume_from_the_cli(tmp_path, capsys):
    from privdl.loop import train

    out = tmp_path / "p"
    cfg = {"algorithm": "porter-dp", "task": "least-squares", "graph": "ring:6", "steps": 20,
           "eval_every": 10, "clip": 1.0, "sigma": 0.5, "dtype": "float64"}  # fmt: skip
    train(cfg, out, progress=False, stop_after=10)
    assert not (out / "summary.json").exists()
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps_done"] == 20 and summary["completed"]
    full = train(cfg, tmp_path / "f", progress=False)
    assert summary["final"]["optimality_gap"] == full["final"]["optimality_gap"]


def test_bad_resumes_and_outputs_are_one_line(tmp_path, capsys):
    """Options beside --resume (silently ignored before), --seeds under launch, --out naming a
    file, corrupt records: one line, exit 2, nothing written."""
    from privdl.loop import train

    run = tmp_path / "run"
    cfg = {"algorithm": "ldp", "task": "least-squares", "graph": "ring:4", "steps": 4,
           "eval_every": 2, "clip": 1.0, "sigma": 0.5}  # fmt: skip
    train(cfg, run, progress=False, stop_after=2)
    before = sorted(p.name for p in run.iterdir())
    file_out = tmp_path / "a-file"
    file_out.write_text("x")
    cases = [
        (["run", "--resume", str(run), "--steps", "10", "--lr", "1"], "drop --steps, --lr"),
        (["run", "dsgd", "--resume", str(run)], "drop the algorithm 'dsgd'"),
        (["launch", "--resume", str(run), "--sigma", "1"], "drop --sigma"),
        (["launch", "ldp", "--graph", "ring:4", "--seeds", "1,2", "--out", str(tmp_path / "s")],
         "launch runs one seed"),
        (["run", "dsgd", "--task", "least-squares", "--graph", "ring:4", "--out", str(file_out)],
         "is a file, not a run directory"),
        (["launch", "dsgd", "--task", "least-squares", "--graph", "ring:4", "--out", str(file_out)],
         "is a file, not a run directory"),
    ]  # fmt: skip
    for argv, msg in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith("error:") and msg in err, (argv, err)
    assert sorted(p.name for p in run.iterdir()) == before and not (tmp_path / "s").exists()
    for name, junk, msg in (("checkpoint.pt", b"garbage", "checkpoint.pt is unreadable"),
                            ("config.json", b"{bad", "config.json is corrupt")):  # fmt: skip
        bad = tmp_path / f"bad-{name}"
        shutil.copytree(run, bad)
        (bad / name).write_bytes(junk)
        assert main(["run", "--resume", str(bad), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and msg in err, err
    assert main(["run", "--resume", str(run), "--no-progress"]) == 0  # the run itself is fine


def test_seeds_repeat_a_run_and_report_mean_and_std(tmp_path, capsys):
    out = tmp_path / "rep"
    argv = ["run", "ldp", "--graph", "ring:6", "--sigma", "0.5", *TINY, "--seeds", "1-2,4"]
    assert main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    gaps = [
        json.loads((out / f"seed-{s}" / "summary.json").read_text())["final"]["optimality_gap"]
        for s in (1, 2, 4)
    ]
    assert len(set(gaps)) == 3  # three different noise draws
    mean, std = float(np.mean(gaps)), float(np.std(gaps, ddof=1))
    assert f"{mean:.4g} ± {std:.2g}" in text and "| 3 |" in text
    assert (out / "report.md").exists()
    # privdl report takes the sweep's directory for its seed runs
    assert main(["report", str(out), "--out", str(tmp_path / "again")]) == 0
    assert f"{mean:.4g} ± {std:.2g}" in (tmp_path / "again" / "report.md").read_text()


def test_resume_of_a_seed_sweep_continues_each_cut_off_run(tmp_path, capsys):
    from privdl.loop import train
    from privdl.registry import make_config

    values = dict(algorithm="ldp", graph="ring:6", sigma=0.5, task="least-squares", steps=20,
                  eval_every=10, clip=1.0, dtype="float64")  # fmt: skip
    train(make_config({**values, "seed": 1}), tmp_path / "s" / "seed-1", stop_after=10)
    train(make_config({**values, "seed": 2}), tmp_path / "s" / "seed-2")
    assert main(["run", "--resume", str(tmp_path / "s"), "--no-progress"]) == 0
    assert json.loads((tmp_path / "s" / "seed-1" / "summary.json").read_text())["completed"]
    assert "| 2 |" in capsys.readouterr().out


def test_resume_of_a_sweep_cut_off_in_its_first_seed_runs_every_seed(tmp_path, capsys, monkeypatch):
    """Ctrl-C in seed 1 of ``--seeds 1-2``: --resume finishes seed 1 AND runs seed 2 (the seed
    list used to live only on the command line, so seed 2 was silently dropped), and every
    seed ends where the uninterrupted sweep's does."""
    import privdl.loop

    argv = ["run", "ldp", "--graph", "ring:6", "--sigma", "0.5", *TINY, "--seeds", "1-2"]
    assert main([*argv, "--out", str(tmp_path / "full")]) == 0
    real_train = privdl.loop.train

    def cut(cfg, out_dir, **kw):
        real_train(cfg, out_dir, **{**kw, "stop_after": 10})
        raise KeyboardInterrupt

    monkeypatch.setattr(privdl.loop, "train", cut)
    assert main([*argv, "--out", str(tmp_path / "cut")]) == 130
    monkeypatch.setattr(privdl.loop, "train", real_train)
    assert not (tmp_path / "cut" / "seed-2").exists()
    capsys.readouterr()
    assert main(["run", "--resume", str(tmp_path / "cut"), "--no-progress"]) == 0
    assert "| 2 |" in capsys.readouterr().out  # two seeds in the table
    for seed in (1, 2):
        rows = [
            [
                {k: v for k, v in json.loads(line).items() if k not in ("wall_time", "timestamp")}
                for line in (tmp_path / d / f"seed-{seed}" / "metrics.jsonl").open()
            ]
            for d in ("full", "cut")
        ]
        assert rows[0] == rows[1] and [r["step"] for r in rows[0]] == [0, 10, 20]
    # a second sweep into the same --out is refused (records are never replaced silently)
    assert main([*argv, "--out", str(tmp_path / "cut")]) == 2
    assert "--resume" in capsys.readouterr().err


@pytest.mark.parametrize("seeds", ["a,b", "3-x", "-1", ""])
def test_bad_seed_lists_are_one_line_errors(tmp_path, capsys, seeds):
    argv = ["run", "ldp", "--graph", "ring:6", "--sigma", "0.5", *TINY, "--seeds", seeds]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "--seeds" in err[0], err


def test_seed_and_seeds_together_are_refused(tmp_path, capsys):
    argv = ["run", "ldp", "--graph", "ring:6", "--sigma", "0.5", *TINY, "--seeds", "1,2"]
    assert main([*argv, "--seed", "3", "--out", str(tmp_path / "o")]) == 2
    assert "not both" in capsys.readouterr().err


def test_a_reproduction_directory_has_one_writer(tmp_path, capsys):
    from privdl.records import RunRecords

    out = tmp_path / "fig2"
    with RunRecords(out).exclusive():
        assert main(["reproduce", "decor-fig2", "--quick", "--out", str(out)]) == 2
    assert "being written by another privdl process" in capsys.readouterr().err
    assert not (out / "report.md").exists()


def test_decor_against_colluders_that_cut_a_node_off_warns_in_one_line(tmp_path, capsys):
    """DECOR against collusion:2 on a ring calibrates to LDP noise; the run said nothing."""
    argv = ["run", "decor", "--graph", "ring:6", "--adversary", "collusion:2", "--epsilon", "5",
            "--delta", "1e-5", *TINY, "--out", str(tmp_path / "d")]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert summary["config"]["sigma_cor"] == 0.0
    err = capsys.readouterr().err.splitlines()
    warned = [line for line in err if "cut a node off" in line]
    assert warned and all(line.startswith("warning: ") for line in warned), err
    assert not any("warnings.warn" in line for line in err), err  # not Python's two-line form


LS = ["--task", "least-squares", "--graph", "ring:8", "--steps", "5"]


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["run", "dsgd", *LS, "--epsilon", "1"], "non-private: drop epsilon"),
        (["run", "dsgd", *LS, "--delta", "1e-6"], "non-private: drop delta"),
        (["run", "porter-gc", *LS, "--clip", "1", "--epsilon", "1", "--delta", "1e-5"],
         "non-private"),
        (["run", "privsgp-vr", "--graph", "expo:8", "--clip", "1", "--sigma", "1", "--steps", "2",
          "--batch-size", "7"], "drop batch_size"),
        (["run", "privsgp", "--graph", "expo:8", "--clip", "1", "--sigma", "1", "--steps", "2",
          "--sampling", "poisson"], "drop sampling"),
        (["run", "privsgp-vr", "--graph", "expo:8", "--clip", "1", "--sigma", "1", "--steps", "2",
          "--mixing", "fdla"], "own push-sum weights"),
        (["run", "ldp", *LS, "--clip", "1", "--sigma", "1", "--seed", "-1"], "'seed'"),
        (["run", "dsgd", *LS, "--graph", "nofile.txt"], "no such edge-list file"),
        (["run", "decor", *LS, "--clip", "1", "--sigma", "0.5", "--epsilon", "3", "--delta",
          "1e-5"], "too small for epsilon 3 over 5 steps"),  # quoted an internal one-step eps
        (["run", "--config", "{tmp}/mixed.toml"], "outside its [run] table"),
        (["report", "{tmp}/afile", "--out", "{tmp}/afile"], "is a file"),
        (["reproduce", "decor-fig1a", "--quick", "--set", "epsilons=4"], "paper's grid"),
        (["reproduce", "decor-fig1a", "--quick", "--set", "topologies=hexagon"], "unknown topolog"),
    ],
)  # fmt: skip
def test_options_a_run_would_ignore_or_crash_on_are_one_line(argv, msg, tmp_path, capsys):
    """Found by QA passes: these were silently ignored (a privacy target on D-SGD, PrivSGP's batch
    options, mixing on the exponential graph, the top-level keys of a file with a [run] table),
    left a run directory behind (seed -1) or ended in a traceback (report into a file, a fig1a
    epsilon off the paper's grid)."""
    (tmp_path / "mixed.toml").write_text('algorithm = "ldp"\n[run]\nsteps = 3\n')
    (tmp_path / "afile").write_text("")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] in ("run", "reproduce"):
        argv += ["--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and err.count("\n") == 0 and msg in err, err
    assert not (tmp_path / "o" / "config.json").exists()


def test_report_refuses_to_write_into_a_run_directory(tmp_path, capsys):
    run = tmp_path / "r"
    assert main(["run", "ldp", *LS, "--clip", "1", "--sigma", "1", "--out", str(run)]) == 0
    before = sorted(p.name for p in run.iterdir())
    assert main(["report", str(run), "--out", str(run)]) == 2
    assert "run's directory" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == before


@pytest.mark.parametrize("cmd", [["run"], ["launch", "--nproc", "2"]])
def test_an_option_and_set_for_the_same_key_are_refused(cmd, tmp_path, capsys):
    """``--sigma 3 --set sigma=2`` ran with sigma 2 and dropped the option without a word."""
    argv = [*cmd, "ldp", *LS, "--clip", "1", "--sigma", "3", "--set", "sigma=2",
            "--out", str(tmp_path / "o")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "sigma given both" in err, err
    assert not (tmp_path / "o").exists()


def test_decor_adversary_is_recorded_under_its_one_label():
    """``collusion:0`` ran labelled ``collusion:0``; it is the eavesdropper (parse_adversary)."""
    from privdl.errors import ConfigError
    from privdl.registry import make_config

    base = dict(algorithm="decor", task="least-squares", clip=1.0)
    assert make_config({**base, "adversary": "collusion:0"}).adversary == "eavesdropper"
    assert make_config({**base, "adversary": "collusion:1"}).adversary == "curious"
    assert make_config({**base, "adversary": "collusion:3"}).adversary == "collusion:3"
    with pytest.raises(ConfigError, match="unknown adversary"):
        make_config({**base, "adversary": "bogus"})


def test_reproduce_prints_how_many_checks_hold(tmp_path, capsys):
    """A reproduction whose checks fail said so only inside report.md (exit 0, no count)."""
    from privdl.cli.reproduce import check_tally

    out = tmp_path / "fig2"
    assert main(["reproduce", "decor-fig2", "--quick", "--out", str(out)]) == 0
    checks = json.loads((out / "summary.json").read_text())["checks"]
    held = sum(bool(c["pass"]) for c in checks)
    assert f"checks: {held} of {len(checks)} hold" in capsys.readouterr().out
    # both shapes a summary keeps its checks in, with failures named
    path = tmp_path / "summary.json"
    path.write_text(
        json.dumps({"checks": [{"name": "a", "pass": True}, {"name": "b", "pass": False}]})
    )
    assert check_tally(path) == "checks: 1 of 2 hold; failed: b"
    path.write_text(json.dumps({"checks": {"x": False, "y": False, "z": True}}))
    assert check_tally(path) == "checks: 1 of 3 hold; failed: x; y"
    path.write_text(json.dumps({"grid": [1]}))
    assert check_tally(path) is None


def test_reproduce_refuses_a_directory_holding_another_reproduction(tmp_path, capsys):
    """robust-hdp-table3 into porter-a9a's output (or one Robust-HDP table resumed into
    another's) ran and left a directory mixing both."""
    out = tmp_path / "fig2"
    assert main(["reproduce", "decor-fig2", "--quick", "--out", str(out)]) == 0
    before = sorted(p.name for p in out.iterdir())
    capsys.readouterr()
    assert main(["reproduce", "robust-hdp-table3", "--quick", "--out", str(out)]) == 2
    assert "holds reproduction 'decor-fig2', not 'robust-hdp-table3'" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == before
    # a directory from before the marker: its summary.json names the reproduction
    old = tmp_path / "old"
    old.mkdir()
    (old / "summary.json").write_text(json.dumps({"reproduction": "porter-a9a"}))
    assert main(["reproduce", "robust-hdp-table3", "--quick", "--out", str(old)]) == 2
    assert "holds reproduction 'porter-a9a'" in capsys.readouterr().err
    # the same reproduction again is fine
    assert main(["reproduce", "decor-fig2", "--quick", "--out", str(out)]) == 0


def test_ctrl_c_is_one_line_and_exit_code_130(monkeypatch, capsys, tmp_path):
    """An interrupted command (Ctrl-C) prints 'aborted' and exits 130, as shells expect; the run
    directory keeps what was written (resume continues it)."""
    import privdl.loop

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(privdl.loop, "train", interrupted)
    code = main(["run", "dsgd", "--task", "least-squares", "--graph", "ring:4", "--steps", "3",
                 "--out", str(tmp_path / "r")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 130 and err.strip() == "aborted"


@pytest.mark.parametrize("content", [b"\xff\xfe", None])
def test_unreadable_config_file_is_one_line(tmp_path, capsys, content):
    """A non-UTF-8 file and a directory given as --config (found by a QA pass)."""
    path = tmp_path / "cfg.toml"
    path.write_bytes(content) if content is not None else path.mkdir()
    assert main(["run", "dsgd", "--config", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("not UTF-8" in err or "is a directory" in err)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "flags, message",
    [(["--master-port", "70000"], "--master-port must be in 0..65535"),
     (["--timeout", "nan"], "--timeout must be a positive number"),
     (["--device", "cuda"], "CUDA is not available")],
)  # fmt: skip
def test_launch_checks_its_flags_before_starting_ranks(tmp_path, capsys, flags, message):
    import torch

    if flags[0] == "--device" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    argv = ["launch", "dsgd", "--task", "least-squares", "--graph", "ring:2", "--steps", "2"]
    assert main([*argv, *flags, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
