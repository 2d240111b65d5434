"""``privdl serve`` over HTTP: its numbers are the CLI's, bad input is a 4xx with a message, and
the server answers the next request.

The oracle is the CLI itself (``privdl account|calibrate|plan ... --json`` through its entry
point), run for the same settings: the page must show exactly what the command prints.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from serve_helpers import cli_json, request, run_job

import privdl
from privdl.serve import compute
from privdl.topology import parse_graph

DECOR = dict(sigma_cdp="1", sigma_cor="10", clip="1", steps="100", delta="1e-5")


def decor_argv(graph: str, adversary: str, **kw: str) -> list[str]:
    s = {**DECOR, **kw}
    return ["account", "decor", "--graph", graph, "--sigma-cdp", s["sigma_cdp"], "--sigma-cor",
            s["sigma_cor"], "--clip", s["clip"], "--steps", s["steps"], "--delta", s["delta"],
            "--adversary", adversary]  # fmt: skip


@pytest.mark.parametrize(
    ("graph", "adversary", "q", "cli_adversary"),
    [("ring:16", "eavesdropper", "", "eavesdropper"), ("torus:4x4", "curious", "", "curious"),
     ("ring:8", "collusion", "2", "collusion:2")],
)  # fmt: skip
def test_decor_page_equals_cli(base_url, capsys, graph, adversary, q, cli_adversary):
    job = run_job(base_url, "decor", {"graph": graph, **DECOR, "adversary": adversary, "q": q})
    assert job["state"] == "done", job
    page = job["result"]
    cli = cli_json(capsys, [*decor_argv(graph, cli_adversary), "--compare"])
    for key in ("epsilon", "delta", "step_rdp", "label", "adversary", "conversion", "mu",
                "budget", "warnings", "compare"):  # fmt: skip
        assert page[key] == cli[key], key
    # every threat model: the CLI's epsilon and label for that --adversary
    for threat, got in page["threat_models"].items():
        want = cli_json(capsys, decor_argv(graph, threat))
        assert (got["epsilon"], got["label"]) == (want["epsilon"], want["label"]), threat
    # the epsilon-vs-steps curve: a point is the CLI's --steps T
    curve = page["threat_models"][cli_adversary]["curve"]
    assert curve["steps"][0] == 1 and curve["steps"][-1] == 100
    t, eps = curve["steps"][3], curve["epsilons"][3]
    assert eps == cli_json(capsys, decor_argv(graph, cli_adversary, steps=str(t)))["epsilon"]
    assert all(a < b for a, b in zip(curve["epsilons"], curve["epsilons"][1:], strict=False))


@pytest.mark.slow  # the example level's PLD compositions: 7 s
def test_decor_example_level_and_curves_equal_cli(base_url, capsys):
    params = {"graph": "ring:8", **DECOR, "steps": "20", "unit": "example",
              "sampling_rate": "0.25", "batch_size": "4", "conversion": "classic"}  # fmt: skip
    job = run_job(base_url, "decor", params)
    assert job["state"] == "done", job
    cli = cli_json(capsys, [*decor_argv("ring:8", "eavesdropper", steps="20"), "--sampling-rate",
                            "0.25", "--batch-size", "4", "--conversion", "classic", "--curve"])  # fmt: skip
    page = job["result"]
    assert (page["epsilon"], page["label"], page["sampling"]) == (
        cli["epsilon"], cli["label"], cli["sampling"])  # fmt: skip
    assert page["curves"]["epsilon_delta"] == cli["curves"]["epsilon_delta"]


def test_dpsgd_calibrate_and_plan_equal_cli(base_url, capsys):
    dp = {"sampling_rate": "1", "steps": "50", "delta": "1e-6", "sampling": "none"}
    job = run_job(base_url, "dpsgd", {**dp, "noise_multiplier": "4"})
    assert job["state"] == "done", job
    argv = ["--sampling-rate", "1", "--steps", "50", "--delta", "1e-6", "--sampling", "none"]
    cli = cli_json(capsys, ["account", "dpsgd", "--noise-multiplier", "4", *argv, "--compare"])
    page = job["result"]
    assert (page["epsilon"], page["label"], page["compare"]) == (
        cli["epsilon"], cli["label"], cli["compare"])  # fmt: skip
    assert len({r["accountant"] for r in page["compare"]}) == 4  # every accountant, side by side

    job = run_job(base_url, "calibrate-dpsgd", {**dp, "epsilon": "2"})  # exact: mu-GDP
    cli = cli_json(capsys, ["calibrate", "dpsgd", "--epsilon", "2", *argv])
    assert job["state"] == "done" and job["result"] == cli

    job = run_job(base_url, "calibrate-decor",
                  {"graph": "ring:16", "epsilon": "8", "steps": "100", "delta": "1e-5"})  # fmt: skip
    cli = cli_json(capsys, ["calibrate", "decor", "--graph", "ring:16", "--epsilon", "8",
                            "--steps", "100", "--delta", "1e-5"])  # fmt: skip
    assert job["state"] == "done" and job["result"]["sigma_cor"] == cli["sigma_cor"]
    assert job["result"]["label"] == cli["label"]

    plan = {"plan": "privsgp", "plan_gradient_bound": "1", "plan_steps": "100",
            "plan_local_samples": "500", "plan_epsilon": "1", "plan_delta": "1e-5"}  # fmt: skip
    job = run_job(base_url, "plan", plan)
    cli = cli_json(capsys, ["plan", "privsgp", "--gradient-bound", "1", "--steps", "100",
                            "--local-samples", "500", "--epsilon", "1", "--delta", "1e-5"])  # fmt: skip
    assert job["state"] == "done"
    assert {k: v for k, v in job["result"].items() if k != "plan"} == cli
    assert cli["nominal"]["nominal"] and not cli["accounted"]["nominal"]


def test_graph_facts_equal_cli_and_drawing(base_url, capsys, monkeypatch):
    status, got = request(base_url, "GET", "/api/graph?graph=torus:4x5")
    assert status == 200
    facts = got["facts"]
    cli = cli_json(capsys, ["graph", "torus:4x5"])
    assert {k: facts[k] for k in cli} == cli
    assert facts["degree_histogram"] == {"4": 20}
    assert len(facts["drawing"]["xy"]) == 20 and len(facts["drawing"]["edges"]) == 40
    monkeypatch.setitem(compute.LIMITS, "draw_nodes", 19)
    status, got = request(base_url, "GET", "/api/graph?graph=torus:5x4")
    assert status == 200 and got["facts"]["drawing"] is None  # too many nodes to draw


def test_upload_is_checked_like_the_cli(base_url, capsys, tmp_path):
    text = "0 1\n1 2\n2 3\n3 0\n0 2\n"
    status, got = request(base_url, "POST", "/api/upload", {"filename": "k.txt", "text": text})
    assert status == 200 and got["graph"].startswith("upload:")
    (tmp_path / "k.txt").write_text(text)
    assert got["facts"]["algebraic_connectivity"] == pytest.approx(
        cli_json(capsys, ["graph", str(tmp_path / "k.txt")])["algebraic_connectivity"], rel=1e-12
    )
    job = run_job(base_url, "decor", {"graph": got["graph"], **DECOR})
    cli = cli_json(capsys, decor_argv(str(tmp_path / "k.txt"), "eavesdropper"))
    assert job["state"] == "done" and job["result"]["epsilon"] == cli["epsilon"]


BAD = [  # (kind or route, body, a word of the message)
    ("decor", {"graph": "ring:16", **DECOR, "sigma_cdp": "abc"}, "sigma_cdp: expected a number"),
    ("decor", {"graph": "ring:16", **DECOR, "sigma_cdp": "-1"}, "sigma_cdp must be > 0"),
    ("decor", {"graph": "ring:16", **DECOR, "sigma_cor": "nan"}, "finite"),
    ("decor", {"graph": "ring:16", **DECOR, "delta": "1"}, "delta must lie in (0, 1)"),
    ("decor", {"graph": "ring:16", **DECOR, "steps": "2.5"}, "steps: expected an integer"),
    ("decor", {"graph": "ring:16", **DECOR, "steps": "1e12"}, "steps must be <="),
    ("decor", {"graph": "ring:100000000", **DECOR}, "100,000,000 nodes"),
    ("decor", {"graph": "complete:2000", **DECOR}, "edges"),
    ("decor", {"graph": "wheel:5", **DECOR}, "unknown graph spec"),
    ("decor", {"graph": "/etc/passwd", **DECOR}, "unknown graph spec"),
    ("decor", {"graph": "ring:6", **DECOR, "adversary": "collusion", "q": "x"}, "q: expected"),
    (
        "decor",
        {"graph": "ring:16", **DECOR, "unit": "example", "sampling_rate": "2", "batch_size": "4"},
        "sampling_rate must be <= 1",
    ),  # fmt: skip
    (
        "decor",
        {"graph": "ring:40", **DECOR, "adversary": "collusion", "q": "5"},
        "colluding sets",
    ),  # the CLI's --max-subsets limit (658 008 sets > 100 000)
    (
        "dpsgd",
        {"noise_multiplier": "0", "sampling_rate": "0.1", "steps": "5", "delta": "1e-5"},
        "noise_multiplier must be >",
    ),
    (
        "calibrate-decor",
        {"graph": "ring:16", "epsilon": "-3", "steps": "5", "delta": "1e-5"},
        "epsilon must be > 0",
    ),
    ("plan", {"plan": "nope"}, "plan: expected one of"),
    ("nope", {}, "kind: expected one of"),
]


def test_bad_inputs_are_4xx_with_a_message_and_the_server_stays_up(base_url):
    for kind, params, words in BAD:
        status, got = request(base_url, "POST", "/api/jobs", {"kind": kind, "params": params})
        if status == 202:  # refused inside the job (the accountants' own checks)
            job = run_job(base_url, kind, params)
            assert job["state"] == "error" and words in job["error"], (kind, params, job)
            continue
        assert status == 400, (kind, params, got)
        assert words in got["error"] and "\n" not in got["error"], (kind, params, got)
        assert "internal error" not in got["error"]
    disconnected = request(base_url, "POST", "/api/upload", {"text": "0 1\n2 3\n"})[1]["graph"]
    for body, code, words in [
        ({"kind": "decor", "params": {"graph": disconnected, **DECOR}}, 400, "disconnected"),
        ({"kind": "decor", "params": "x"}, 400, "params"),
    ]:
        status, got = request(base_url, "POST", "/api/jobs", body)
        assert status == code and words in got["error"], got
    for text, words in [("0 1\n1 1\n", "self-loop 1-1"), ("0 1\n1 x\n", "non-integer node"),
                        ("0 1\n0 1\n", "duplicate edge"), ("", "no edges"),
                        ("1 2\n2 3\n", "node ids must be 0..n-1")]:  # fmt: skip
        status, got = request(base_url, "POST", "/api/upload", {"filename": "e.txt", "text": text})
        assert status == 400 and "e.txt" in got["error"] and words in got["error"], got
        assert "privdl-serve-" not in got["error"]  # the temporary copy's path is not shown
    for method, path, raw, code in [
        ("POST", "/api/jobs", b"{not json", 400),
        ("POST", "/api/upload", b"x" * (compute.LIMITS["upload_bytes"] + 1), 413),
        ("GET", "/api/jobs/999999", None, 404),
        ("GET", "/api/nothing", None, 404),
        ("GET", "/static/../../pyproject.toml", None, 404),
        ("GET", "/api/graph?graph=upload:0000", None, 400),
    ]:
        status, got = request(base_url, method, path, raw=raw)
        assert status == code and got["error"], (path, got)
    # still up, and still right
    job = run_job(base_url, "decor", {"graph": "ring:16", **DECOR})
    assert job["state"] == "done" and math.isfinite(job["result"]["epsilon"])


def test_cancel_and_download(base_url):
    slow = {"graph": "torus:20x20", **DECOR, "adversary": "curious"}
    first = request(base_url, "POST", "/api/jobs", {"kind": "decor", "params": slow})[1]
    second = request(base_url, "POST", "/api/jobs", {"kind": "decor", "params": slow})[1]
    assert second["state"] == "queued"
    for job in (second, first):
        status, got = request(base_url, "POST", f"/api/jobs/{job['id']}/cancel")
        assert status == 200 and got["state"] == "cancelled"
    assert request(base_url, "GET", f"/api/jobs/{first['id']}/download")[0] == 409
    done = run_job(base_url, "decor", {"graph": "ring:16", **DECOR})  # runs after the cancelled
    assert done["state"] == "done"
    assert request(base_url, "GET", f"/api/jobs/{second['id']}")[1]["state"] == "cancelled"
    status, js = request(base_url, "GET", f"/api/jobs/{done['id']}/download?format=json")
    assert status == 200 and js["epsilon"] == done["result"]["epsilon"]
    status, text = request(base_url, "GET", f"/api/jobs/{done['id']}/download?format=csv")
    assert status == 200 and text.startswith("key,value")
    assert f"epsilon,{done['result']['epsilon']!r}" in text.splitlines()
    assert "threat_models.curious.curve.epsilons[0]," in text


def test_page_is_offline_and_served(base_url):
    folder = Path(privdl.__file__).parent / "resources" / "serve"
    for name in ("index.html", "app.js", "app.css"):
        text = (folder / name).read_text()
        status, served = request(base_url, "GET", f"/static/{name}")
        assert status == 200 and served == text
        # nothing fetched from elsewhere: no absolute URL but the SVG namespace
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.\w+", text)) - {"http://www.w3.org"}
        assert not urls, (name, urls)
    assert request(base_url, "GET", "/")[1] == (folder / "index.html").read_text()


@pytest.mark.parametrize(
    ("spec", "kind"),
    [("ring:7", "ring"), ("torus:3x5", "torus"), ("grid:4x2", "grid"), ("complete:6", "complete"),
     ("regular:12:3:1", "regular"), ("er:30:0.3:2", "er"), ("star:5", "star")],
)  # fmt: skip
def test_spec_size_bounds_the_built_graph(spec, kind):
    n, edges = compute.spec_size(spec)
    topo = parse_graph(spec)
    assert n == topo.n and topo.num_edges <= max(edges, 1) * (1.5 if kind == "er" else 1)


def test_serve_command_listens_on_loopback_and_says_so():
    proc = subprocess.Popen(
        [sys.executable, "-m", "privdl", "serve", "--port", "0"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stderr.readline()
        assert "loopback only" in line, line
        url = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)
        deadline = time.monotonic() + 30
        while True:
            try:
                status, _ = request(url, "GET", "/api/limits")
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_reused_step_gives_the_recomputed_epsilon():
    """account_decor(step=...) (the page's epsilon-vs-steps curve) equals the full computation
    at every T, and refuses a step of another threat model."""
    from privdl.accounting import account_decor
    from privdl.errors import PrivacyError

    graph = parse_graph("torus:3x4").graph
    kw = dict(sigma_cdp=1.0, sigma_cor=5.0, delta=1e-6, adversary="curious")
    step = compute.step_of(account_decor(graph, steps=7, **kw))
    for t in (1, 30, 500):
        assert account_decor(graph, steps=t, step=step, **kw).epsilon == (
            account_decor(graph, steps=t, **kw).epsilon
        )
    with pytest.raises(PrivacyError, match="against curious, not eavesdropper"):
        account_decor(graph, steps=3, step=step, **{**kw, "adversary": "eavesdropper"})
