"""CLI: exit codes and one-line errors."""

import json

import pytest

from privdl.cli.main import main


def _err_lines(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    return err


@pytest.mark.parametrize(
    "argv",
    [
        ["graph", "ring:0"],
        ["graph", "nonsense"],
        ["run", "dsgd", "--task", "least-squares", "--graph", "ring:x"],
        ["run", "dsgd", "--task", "least-squares", "--set", "bogus=1"],
        ["run", "dsgd", "--task", "least-squares", "--lr", "-1"],
        ["run", "ldp", "--task", "least-squares", "--clip", "1", "--sigma", "0"],
        ["run", "dsgd", "--task", "mnist", "--data-dir", "/nonexistent-dir", "--steps", "1"],
        ["run", "--config", "/nonexistent.toml"],
    ],
)
def test_bad_input_exits_2_with_one_line(argv, capsys, tmp_path):
    rc = main([*argv, "--out", str(tmp_path / "o")] if argv[0] == "run" else argv)
    assert rc == 2
    err = _err_lines(capsys)
    assert len(err) == 1 and err[0].startswith("error:")
    assert "Traceback" not in err[0]
    assert not (tmp_path / "o" / "summary.json").exists()


def test_missing_mnist_message_says_where_it_looked(capsys, tmp_path):
    rc = main(
        [
            "run",
            "dsgd",
            "--task",
            "mnist",
            "--data-dir",
            str(tmp_path),
            "--steps",
            "1",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "PRIVDL_DATA_DIR" in err


def test_graph_json(capsys):
    assert main(["graph", "torus:4x4", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n"] == 16 and info["edges"] == 32 and info["connected"] is True
    assert info["algebraic_connectivity"] == pytest.approx(2.0)


def test_run_and_report(tmp_path, capsys):
    out = tmp_path / "r"
    rc = main(
        [
            "run",
            "ldp",
            "--task",
            "least-squares",
            "--graph",
            "ring:8",
            "--steps",
            "40",
            "--lr",
            "0.01",
            "--clip",
            "1",
            "--clip-mode",
            "batch_mean",
            "--epsilon",
            "8",
            "--eval-every",
            "10",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    assert "eps=8" in capsys.readouterr().out
    rc = main(["report", str(out), "--out", str(tmp_path / "rep")])
    assert rc == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "secrdp+gaussian" in text and "optimality_gap.png" in text  # the exact default
    assert (tmp_path / "rep" / "optimality_gap.png").stat().st_size > 1000


def test_debug_shows_traceback(capsys):
    from privdl.errors import GraphError

    with pytest.raises(GraphError):
        main(["graph", "nonsense", "--debug"])
