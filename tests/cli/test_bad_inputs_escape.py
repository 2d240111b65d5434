"""Issue 29, item 5: bad inputs that used to escape are one line, exit code 2, nothing written."""

from __future__ import annotations

import time

import pytest

from privdl.cli.main import main
from privdl.cli.run import MAX_SEEDS, parse_seeds
from privdl.config import MAX_STEPS
from privdl.errors import ConfigError

LS = ["ldp", "--task", "least-squares", "--graph", "ring:4", "--clip", "1", "--no-progress"]


def _refused(argv, capsys, match: str) -> str:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err
    return err


def _nothing_in(path) -> None:
    assert not any(path.iterdir()), sorted(p.name for p in path.rglob("*"))


def test_steps_1e23_in_a_toml_config(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.toml").write_text(
        'algorithm = "ldp"\ntask = "least-squares"\ngraph = "ring:4"\nclip = 1.0\n'
        "sigma = 1.0\nsteps = 1e23\n"
    )
    _refused(["run", "--config", "f.toml", "--out", "o"], capsys, "limit of 10^9")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.toml"]


@pytest.mark.parametrize("steps", ["1000000000000000000000000000000", "1000000001"])
def test_huge_steps_with_calibration(steps, tmp_path, capsys):
    out = tmp_path / "o"
    err = _refused(["run", *LS, "--epsilon", "3", "--steps", steps, "--out", str(out)], capsys,
                   "more than privdl's limit of 10^9")  # fmt: skip
    assert "64-bit counter" in err and not out.exists()
    _refused(["run", *LS, "--epsilon", "3", "--set", "steps=1e30", "--out", str(out)], capsys,
             "limit of 10^9")  # fmt: skip
    assert not out.exists()


def test_the_steps_limit_is_the_documented_one():
    from privdl.registry import make_config

    base = {"algorithm": "ldp", "task": "least-squares", "graph": "ring:4", "sigma": 1.0}
    assert make_config({**base, "steps": MAX_STEPS}).steps == MAX_STEPS == 10**9
    with pytest.raises(ConfigError, match="10\\^9"):
        make_config({**base, "steps": MAX_STEPS + 1})


def test_a_seeds_range_of_ten_million_is_refused_at_once(tmp_path, capsys):
    out = tmp_path / "s"
    t0 = time.perf_counter()
    err = _refused(["run", *LS, "--sigma", "1", "--steps", "2", "--seeds", "0-10000000",
                    "--out", str(out)], capsys, f"at most {MAX_SEEDS}")  # fmt: skip
    assert time.perf_counter() - t0 < 5 and "0-10000000" in err
    assert not out.exists()


def test_parse_seeds_limit_and_linear_time():
    assert parse_seeds("1-3,2,7") == [1, 2, 3, 7]
    assert parse_seeds(f"0-{MAX_SEEDS - 1}") == list(range(MAX_SEEDS))
    with pytest.raises(ConfigError, match="more than"):
        parse_seeds(f"0-{MAX_SEEDS}")
    with pytest.raises(ConfigError, match="more than"):
        parse_seeds(f"0-{MAX_SEEDS // 2},{MAX_SEEDS}-{2 * MAX_SEEDS}")  # counted over parts
    with pytest.raises(ConfigError, match="expected e.g."):
        parse_seeds("1-x")
    t0 = time.perf_counter()  # quadratic (a list's `in`) took seconds at this size
    for _ in range(5):
        parse_seeds(",".join(str(s) for s in range(MAX_SEEDS)))
    assert time.perf_counter() - t0 < 2


@pytest.mark.parametrize("command", ["account", "calibrate"])
def test_a_disconnected_edge_list_for_decor_accounting(command, tmp_path, capsys):
    edges = tmp_path / "edges.txt"
    edges.write_text("0 1\n1 2\n2 0\n3 4\n4 5\n5 3\n")
    noise = (["--sigma-cdp", "40", "--sigma-cor", "100"] if command == "account"
             else ["--epsilon", "3"])  # fmt: skip
    argv = [command, "decor", "--graph", str(edges), *noise, "--clip", "1", "--steps", "100",
            "--delta", "1e-5", "--json"]  # fmt: skip
    _refused(argv, capsys, "is disconnected (2 components)")
    assert capsys.readouterr().out == ""


def test_a_connected_edge_list_still_accounts(tmp_path, capsys):
    edges = tmp_path / "edges.txt"
    edges.write_text("0 1\n1 2\n2 3\n3 0\n")
    assert main(["account", "decor", "--graph", str(edges), "--sigma-cdp", "40", "--sigma-cor",
                 "100", "--steps", "100", "--delta", "1e-5", "--json"]) == 0  # fmt: skip


@pytest.mark.parametrize("seeds", [None, "1-2"])
def test_over_long_out_name_and_path(seeds, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = ["--seeds", seeds] if seeds else []
    argv = ["run", *LS, "--sigma", "1", "--steps", "2", *sweep, "--out"]
    long_name = "parent/" + "n" * 256 + "/child"
    _refused([*argv, long_name], capsys, "is 256 bytes, more than the 255")
    long_path = "/".join(["d" * 200] * 21)  # every name fits; the path (4220 bytes) does not
    _refused([*argv, long_path], capsys, "too long for the 4096")
    _nothing_in(tmp_path)


def test_an_out_path_just_under_the_limit_only_for_a_sweep(tmp_path, capsys, monkeypatch):
    """A sweep's ``OUT/seed-K`` is checked before OUT is made: no half-made sweep."""
    monkeypatch.chdir(tmp_path)
    out = "/".join(["d" * 200] * 20) + "/" + "e" * 40
    assert len(out) + 32 < 4096 <= len(out) + len("/seed-10") + 32
    _refused(["run", *LS, "--sigma", "1", "--steps", "2", "--seeds", "9-10", "--out", out],
             capsys, "too long for the 4096")  # fmt: skip
    _nothing_in(tmp_path)
