"""The command line as people expect it (issue 32): help and defaults on every option, light
start-up, progress on a terminal and off it, restarts with --resume-if-exists."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest

from privdl import loop
from privdl.cli.main import _COMMANDS, cli, main
from privdl.cli.options import says_default
from privdl.registry import make_config

SRC = str(Path(__file__).resolve().parents[2] / "src")
RUN = ["decor", "--task", "least-squares", "--graph", "ring:4", "--steps", "12",
       "--eval-every", "4", "--clip", "1", "--clip-mode", "batch_mean", "--epsilon", "5",
       "--dtype", "float64"]  # fmt: skip


def _commands() -> list[tuple[str, click.Command]]:
    ctx = click.Context(cli)
    return [(name, cli.get_command(ctx, name)) for name in cli.list_commands(ctx)]  # type: ignore[misc]


def test_every_option_of_every_command_has_help_and_shows_its_default():
    seen = 0
    for name, command in _commands():
        ctx = click.Context(command, info_name=name)
        for param in command.params:
            if not isinstance(param, click.Option) or param.name == "help":
                continue
            record = param.get_help_record(ctx)
            assert record is not None and param.help, f"privdl {name} {param.opts[0]}: no help"
            assert says_default(param) and "default" in record[1].lower(), (
                f"privdl {name} {param.opts[0]}: no default shown: {record[1]!r}"
            )
            seen += 1
    assert seen > 150  # run's and launch's config options among them


def test_run_help_shows_the_config_models_defaults(capsys):
    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for option, default in (("--steps INTEGER", "500"), ("--lr FLOAT", "0.1"),
                            ("--batch-size INTEGER", "64"), ("--seed INTEGER", "0"),
                            ("--eval-every INTEGER", "50"), ("--weight-decay FLOAT", "0.0")):  # fmt: skip
        at = text.index(option)
        assert f"[default: {default}]" in text[at : at + 200], option
    assert "Target delta (default 1e-5)" in text
    assert "[default: ring:16; server for robust-hdp" in text  # families differ: both shown


def test_the_command_list_needs_no_import_and_matches_the_commands():
    for name, command in _commands():
        listed = _COMMANDS[name][2]
        assert len(listed) <= 66, name  # one line at 80 columns
        assert listed.split()[0] == (command.help or "").split()[0], name


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["graph", "ring:8", "--json"],
        [
            "account",
            "dpsgd",
            "--noise-multiplier",
            "1.5",
            "--sampling-rate",
            "0.04",
            "--steps",
            "100",
            "--delta",
            "1e-5",
            "--json",
        ],
        [
            "calibrate",
            "decor",
            "--graph",
            "ring:4",
            "--epsilon",
            "5",
            "--delta",
            "1e-5",
            "--steps",
            "100",
            "--clip",
            "1",
            "--json",
        ],
    ],  # fmt: skip
    ids=["help", "graph", "account", "calibrate"],
)
def test_help_graph_account_and_calibrate_do_not_import_torch(argv):
    code = (
        "import sys, time; t = time.perf_counter(); from privdl.cli.main import main; "
        f"rc = main({argv!r}); "
        "print(rc, 'torch' in sys.modules, time.perf_counter() - t, file=sys.stderr)"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    rc, torch_loaded, seconds = done.stderr.split()[-3:]
    assert rc == "0" and torch_loaded == "False", done.stderr
    if argv == ["--help"]:
        assert float(seconds) < 5.0  # about 0.2 s on an idle box; generous for a busy CI


def test_long_runs_print_a_short_line_when_stderr_is_not_a_terminal(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRIVDL_PROGRESS_EVERY", "0.05")

    def slow(row):
        time.sleep(0.2)

    cfg = make_config({"algorithm": "dsgd", "task": "least-squares", "graph": "ring:4",
                       "steps": 6, "eval_every": 2})  # fmt: skip
    loop.train(
        cfg, tmp_path / "a", callbacks=[type("S", (), {"on_evaluate": staticmethod(slow)})()]
    )
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("dsgd: step ")]
    assert len(lines) >= 3
    assert re.fullmatch(r"dsgd: step \d+/6 \(\d+%\), 0:00:\d\d.*", lines[-1])
    assert any("loss=" in x for x in lines) and all(len(x) < 200 for x in lines)
    loop.train(cfg, tmp_path / "b", progress=False, callbacks=[])  # --no-progress: silent
    assert "step" not in capsys.readouterr().err


def test_the_progress_bar_is_readable_under_an_80_column_terminal(tmp_path):
    pty = pytest.importorskip("pty")
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(PYTHONPATH=SRC, TERM="xterm")
    proc = subprocess.Popen(
        [sys.executable, "-m", "privdl", "run", *RUN, "--out", str(tmp_path / "r")],
        stdin=slave, stdout=subprocess.DEVNULL, stderr=slave, env=env, close_fds=True,
    )  # fmt: skip
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=120) == 0
    os.close(master)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    lines = [x.rstrip() for x in re.split(r"[\r\n]+", text) if x.strip()]
    assert lines and all(len(x) <= 80 for x in lines), [x for x in lines if len(x) > 80]
    assert not any("…" in x for x in lines)
    assert any(re.search(r"decor .*12/12", x) for x in lines)
    info = " ".join(lines[-3:])  # the metrics under the bar, folded, not cut
    assert "eps=5" in info and "eavesdropper" in info and "optimality_gap=" in info


def test_resume_if_exists_starts_then_resumes_and_refuses_other_options(tmp_path, capsys):
    out = tmp_path / "r"
    args = ["run", *RUN, "--out", str(out), "--no-progress", "--resume-if-exists"]
    # a first attempt cut off after step 4 (as a supervisor's restart would find it)
    loop.train(make_config({**_values(RUN), "algorithm": "decor"}), out, stop_after=4,
               progress=False)  # fmt: skip
    assert main(args) == 0
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 4, 8, 12]  # resumed: no step recorded twice
    full = loop.train(make_config({**_values(RUN), "algorithm": "decor"}), tmp_path / "f",
                      progress=False)  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final"]["optimality_gap"] == full["final"]["optimality_gap"]
    assert summary["final"]["privacy"] == full["final"]["privacy"]
    capsys.readouterr()
    assert main(args) == 0  # the same command again: complete, said so, nothing rewritten
    err = capsys.readouterr().err
    assert "already complete (12 steps" in err and "nothing to resume" in err
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4
    assert main([*args[:-1], "--resume-if-exists", "--lr", "0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "other options (lr=0.1 (given 0.5))" in err
    assert main(["run", *RUN, "--out", str(tmp_path / "new"), "--no-progress",
                 "--resume-if-exists"]) == 0  # fmt: skip
    assert json.loads((tmp_path / "new" / "summary.json").read_text())["completed"]
    assert main([*args, "--overwrite"]) == 2


def test_resume_of_a_finished_run_says_so(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", *RUN, "--out", str(out), "--no-progress"]) == 0
    first = capsys.readouterr().out
    assert main(["run", "--resume", str(out)]) == 0
    done = capsys.readouterr()
    assert f"{out}: the run is already complete (12 steps, finished at 20" in done.err
    assert "privacy: eps=5" in done.out and "privacy: eps=5" in first


def _values(argv: list[str]) -> dict:
    values = {}
    for flag, value in zip(argv[1::2], argv[2::2], strict=True):
        values[flag[2:].replace("-", "_")] = value
    return values


def test_launch_resume_if_exists_refuses_another_run_before_starting_ranks(tmp_path, capsys):
    out = tmp_path / "r"
    loop.train(make_config({**_values(RUN), "algorithm": "decor"}), out, progress=False)
    argv = ["launch", "--nproc", "2", *RUN, "--out", str(out), "--resume-if-exists"]
    assert main([*argv, "--lr", "0.3"]) == 2
    err = capsys.readouterr().err
    assert "other options (lr=0.1 (given 0.3))" in err and "rank" not in err
    assert main([*argv, "--overwrite"]) == 2
    assert "not both" in capsys.readouterr().err
