"""``privdl account / calibrate / plan`` through privdl.cli.main.main (exit codes, JSON keys)."""

from __future__ import annotations

import json
import math

import pytest

from privdl.cli.main import main


def run_json(capsys, argv):
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


DECOR = [
    "account",
    "decor",
    "--graph",
    "ring:16",
    "--sigma-cdp",
    "22.96953176771683",
    "--sigma-cor",
    "94",
    "--steps",
    "3500",
    "--delta",
    "1e-5",
]


def test_account_decor_json(capsys):
    out = run_json(capsys, [*DECOR, "--conversion", "classic", "--json"])
    for key in ("epsilon", "delta", "step_rdp", "adversary", "conversion", "method"):
        assert key in out
    assert out["epsilon"] == pytest.approx(10.45968939494, rel=1e-10)  # the paper's (ACC-1)
    assert out["step_rdp"] == pytest.approx(4.787248702488e-04, rel=1e-10)
    assert out["adversary"] == "eavesdropper" and out["conversion"] == "classic"
    # the default: the exact conversion of the same Gaussian mechanism, mu = sqrt(2 T step_rdp)
    exact = run_json(capsys, [*DECOR, "--json"])
    mu = math.sqrt(2 * 3500 * exact["step_rdp"])
    assert exact["conversion"] == "gaussian" and exact["budget"]["mu"] == pytest.approx(mu)
    assert exact["epsilon"] < out["epsilon"]
    from scipy.stats import norm

    def bw_delta(e):  # Balle and Wang 2018, Thm 8
        return norm.cdf(-e / mu + mu / 2) - math.exp(e + norm.logcdf(-e / mu - mu / 2))

    assert bw_delta(exact["epsilon"]) <= 1e-5 < bw_delta(exact["epsilon"] * (1 - 1e-6))


def test_account_decor_curious_and_table(capsys):
    out = run_json(
        capsys,
        [
            "account",
            "decor",
            "--graph",
            "ring:16",
            "--sigma-cdp",
            "1",
            "--sigma-cor",
            "10",
            "--steps",
            "1",
            "--delta",
            "1e-5",
            "--adversary",
            "curious",
            "--json",
        ],
    )
    assert out["step_rdp"] == pytest.approx(0.211261896999, rel=1e-10)
    assert main(DECOR) == 0
    assert "epsilon" in capsys.readouterr().out


DECOR_EXAMPLE_LEGACY = [
    "account",
    "decor",
    "--graph",
    "ring:16",
    "--sigma-cdp",
    "0.005",
    "--sigma-cor",
    "0.1",
    "--steps",
    "1000",
    "--delta",
    "1e-5",
    "--sampling-rate",
    str(64 / 3750),
    "--batch-size",
    "64",
    "--conversion",
    "legacy-uncomposed",
    "--json",
]


def test_account_decor_example_level(capsys):
    out = run_json(capsys, DECOR_EXAMPLE_LEGACY)
    assert out["epsilon"] == pytest.approx(0.00758, abs=1e-5)
    assert out["budget"]["nominal"] is True
    # The readable table flags the number itself, not only the label row.
    argv = [a for a in DECOR_EXAMPLE_LEGACY if a != "--json"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    flat = " ".join(text.replace("│", " ").split())  # rows wrap at the terminal's width
    assert "epsilon 0.00758" in flat and "NOMINAL: not an (epsilon, delta) guarantee" in flat
    assert "NOT a DP guarantee" in flat


def test_account_decor_batch_size_without_sampling_rate_is_refused(capsys):
    """A batch size alone was ignored (user-level numbers printed as if it was not given)."""
    assert main([*DECOR, "--batch-size", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "sampling rate" in err, err


def test_account_dpsgd(capsys):
    base = [
        "account",
        "dpsgd",
        "--noise-multiplier",
        "1.5",
        "--sampling-rate",
        "0.04",
        "--steps",
        "2250",
        "--delta",
        "1e-5",
        "--json",
    ]
    assert run_json(capsys, [*base, "--accountant", "rdp"])["epsilon"] == pytest.approx(
        7.329, abs=1e-3
    )
    assert run_json(capsys, [*base, "--accountant", "pld"])["epsilon"] == pytest.approx(
        6.769, abs=1e-3
    )
    default = run_json(capsys, base)  # the tightest certified: PLD here, and so labelled
    assert default["epsilon"] == pytest.approx(6.769, abs=1e-3) and default["accountant"] == "pld"


def test_calibrate_decor(capsys):
    out = run_json(
        capsys,
        [
            "calibrate",
            "decor",
            "--graph",
            "ring:16",
            "--epsilon",
            "5",
            "--delta",
            "1e-5",
            "--steps",
            "1000",
            "--sigma-cdp",
            "41.68",
            "--json",
        ],
    )
    assert out["epsilon_achieved"] <= 5.0
    assert out["epsilon_achieved"] == pytest.approx(5.0, rel=1e-4)
    check = run_json(
        capsys,
        [
            "account",
            "decor",
            "--graph",
            "ring:16",
            "--sigma-cdp",
            "41.68",
            "--sigma-cor",
            repr(out["sigma_cor"]),
            "--steps",
            "1000",
            "--delta",
            "1e-5",
            "--json",
        ],
    )
    assert check["epsilon"] == pytest.approx(out["epsilon_achieved"], rel=1e-12)


def test_calibrate_decor_default_sigma_cdp(capsys):
    """Without --sigma-cdp: sqrt(2) x the CDP level sigma_ldp/sqrt(16) on the ring (eavesdropper),
    where sigma_ldp = C sqrt(2/eps_iter) with eps_iter from (ACC-2)."""
    out = run_json(
        capsys,
        ["calibrate", "decor", "--graph", "ring:16", "--epsilon", "5", "--delta", "1e-5"]
        + ["--steps", "1000", "--conversion", "classic", "--json"],
    )
    log = math.log(1e5)
    eps_iter = (math.sqrt(log + 5.0) - math.sqrt(log)) ** 2 / 1000
    sigma_ldp = math.sqrt(2.0 / eps_iter)
    assert out["sigma_cdp_rule"].startswith("default")
    assert out["sigma_cdp"] == pytest.approx(math.sqrt(2.0) * sigma_ldp / 4.0, rel=1e-9)
    assert out["sigma_cdp_min"] == pytest.approx(sigma_ldp / 4.0, rel=1e-9)
    assert out["epsilon_achieved"] == pytest.approx(5.0, rel=1e-4)
    assert out["epsilon_achieved"] <= 5.0


def test_plan_commands(capsys):
    out = run_json(
        capsys,
        [
            "plan",
            "privsgp",
            "--gradient-bound",
            "10",
            "--steps",
            "3120",
            "--local-samples",
            "3125",
            "--epsilon",
            "3",
            "--delta",
            "1e-5",
            "--json",
        ],
    )
    assert out["sigma"] == pytest.approx(0.60651, rel=3e-4)
    assert out["nominal"]["nominal"] is True and out["epsilon_accounted"] > 3
    out = run_json(
        capsys,
        [
            "plan",
            "porter",
            "--tau",
            "1",
            "--steps",
            "1000",
            "--local-samples",
            "3256",
            "--epsilon",
            "0.01",
            "--delta",
            "1e-3",
            "--json",
        ],
    )
    assert out["sigma_p"] == pytest.approx(2.5526, abs=1e-4)


@pytest.mark.parametrize(
    "extra",
    [
        ["--sigma-cdp", "0"],
        ["--sigma-cdp", "-1"],
        ["--delta", "1.5"],
        ["--delta", "0"],
        ["--adversary", "collusion:16"],
        ["--adversary", "robot"],
        ["--sigma-cor", "-2"],
    ],
)
def test_bad_input_exit_2(capsys, extra):
    argv = list(DECOR)
    for flag, value in zip(extra[::2], extra[1::2], strict=False):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("content", ["0 0\n0 1\n", "0 1\n1 0\n", "0 1\n1 x\n", "0 1.5\n"])
def test_bad_edge_lists_exit_2(tmp_path, capsys, content):
    path = tmp_path / "edges.txt"
    path.write_text(content)
    argv = [
        "account",
        "decor",
        "--graph",
        str(path),
        "--sigma-cdp",
        "1",
        "--sigma-cor",
        "1",
        "--steps",
        "10",
        "--delta",
        "1e-5",
        "--json",
    ]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("error:")


def test_edge_list_file(tmp_path, capsys):
    path = tmp_path / "k2.txt"
    path.write_text("0 1\n")
    out = run_json(
        capsys,
        [
            "account",
            "decor",
            "--graph",
            str(path),
            "--sigma-cdp",
            "1",
            "--sigma-cor",
            "2",
            "--steps",
            "1",
            "--delta",
            "1e-5",
            "--json",
        ],
    )
    assert out["step_rdp"] == pytest.approx(10 / 9, rel=1e-13)


def test_collusion_limit_needs_force(capsys):
    argv = [
        "account",
        "decor",
        "--graph",
        "ring:12",
        "--sigma-cdp",
        "1",
        "--sigma-cor",
        "1",
        "--steps",
        "1",
        "--delta",
        "1e-5",
        "--adversary",
        "collusion:3",
        "--max-subsets",
        "10",
        "--json",
    ]
    assert main(argv) == 2
    assert "force" in capsys.readouterr().err
    assert run_json(capsys, [*argv, "--force"])["step_rdp"] == pytest.approx(2.0)


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["account", "dpsgd", "--noise-multiplier", "1", "--sampling-rate", "0.01", "--steps",
          "10", "--delta", "1e-5", "--sampling", "fixed_size", "--neighbouring", "replace_one",
          "--dataset-size", "0"], "--dataset-size"),
        (["account", "dpsgd", "--noise-multiplier", "1e-9", "--sampling-rate", "0.01", "--steps",
          "10", "--delta", "1e-5", "--accountant", "pld"], "use the rdp accountant"),
        (["calibrate", "dpsgd", "--epsilon", "1000", "--delta", "1e-5", "--sampling-rate", "0.01",
          "--steps", "100", "--accountant", "pld"], "does not constrain the noise"),
        (["calibrate", "dpsgd", "--epsilon", "inf", "--delta", "1e-5", "--sampling-rate", "0.01",
          "--steps", "100", "--json"], "finite"),
        (["calibrate", "decor", "--graph", "ring:8", "--delta", "1e-5", "--steps", "100",
          "--epsilon", "1", "--rtol", "0"], "--rtol"),
        (["calibrate", "decor", "--graph", "ring:8", "--delta", "1e-5", "--steps", "0",
          "--epsilon", "1"], "--steps"),
        (["plan", "privsgp", "--gradient-bound", "1", "--local-samples", "100", "--epsilon", "1",
          "--delta", "1e-5", "--A", "1", "--nodes", "0", "--smoothness", "1", "--dim", "10"],
         "--nodes"),
        (["plan", "robust-hdp", "--epsilon", "1", "--delta", "1e-5", "--batch-size", "16",
          "--dataset-size", "100", "--rounds", "0"], "--rounds"),
    ],
)  # fmt: skip
def test_degenerate_accounting_input_is_one_line_not_a_crash_or_a_hang(capsys, argv, msg):
    """Found by a QA pass: these crashed (division by zero, a 38 GiB PLD), hung (rtol 0, a PLD
    search walking to z = 1e-3) or printed Infinity as JSON."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and err.count("\n") == 0 and msg in err, err


def test_dpsgd_commands_label_their_epsilon_with_the_threat_model_asked(capsys):
    base = ["--delta", "1e-5", "--sampling-rate", "0.01", "--steps", "100"]
    cal = ["calibrate", "dpsgd", "--epsilon", "2", *base]
    server, ldp = (
        run_json(capsys, [*cal, "--json"]),
        run_json(capsys, [*cal, "--threat-model", "ldp", "--json"]),
    )
    assert server["noise_multiplier"] == ldp["noise_multiplier"]  # the label, not the arithmetic
    assert server["budget"]["threat_model"] == "server" and ldp["budget"]["threat_model"] == "ldp"
    assert ldp["label"].endswith("pld, ldp, example-level, add_remove")
    assert main([*cal, "--threat-model", "ldp"]) == 0  # the text table carries the label too
    text = capsys.readouterr().out
    assert "ldp, example-level, add_remove" in text and "label" in text
    acc = ["account", "dpsgd", "--noise-multiplier", str(ldp["noise_multiplier"]), *base]
    out = run_json(capsys, [*acc, "--threat-model", "central", "--json"])
    assert out["threat_model"] == "central" and out["epsilon"] == pytest.approx(
        ldp["epsilon_achieved"], rel=1e-12
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["account", "dpsgd", "--noise-multiplier", "1e300", "--sampling-rate", "0.01", "--steps",
         "100", "--delta", "1e-5"],
        ["account", "decor", "--graph", "ring:8", "--steps", "100", "--delta", "1e-5",
         "--sigma-cor", "1", "--sigma-cdp", "1e-200"],
        ["plan", "privsgp", "--gradient-bound", "1", "--local-samples", "100", "--delta", "1e-5",
         "--steps", "10", "--epsilon", "1e300"],
        ["calibrate", "decor", "--graph", "ring:8", "--delta", "1e-5", "--steps", "10",
         "--epsilon", "1e-300"],
    ],
)  # fmt: skip
def test_extreme_finite_values_are_one_line_exit_2(capsys, argv):
    """Values that pass validation but overflow the arithmetic (found by a QA pass): one line
    on stderr and exit 2, not a traceback; --debug re-raises."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the values given are outside the range") and err.count("\n") == 1
    with pytest.raises(ArithmeticError):
        main([*argv, "--debug"])


def test_extreme_noise_ratio_is_accounted_not_refused(capsys):
    """sigma_cor / sigma_cdp = 1e10 is extreme but computable: the eavesdropper's step RDP is then
    the CDP limit 2C^2/(n sigma_cdp^2) to rounding (Alg 2's vertex-transitive closed form with lambda_k > 0 terms ~1e-20),
    not a refusal and not the ~2800x smaller number a plain inverse of Sigma gave."""
    out = run_json(
        capsys,
        ["account", "decor", "--graph", "ring:8", "--steps", "100", "--delta", "1e-5",
         "--sigma-cor", "1", "--sigma-cdp", "1e-10", "--json"],
    )  # fmt: skip
    assert out["step_rdp"] == pytest.approx(2 / (8 * 1e-20), rel=1e-12)
