"""``privdl serve`` in a real browser: headless Chromium driven by Selenium.

The page is filled in as a user would (typing into the fields, choosing from the menus, clicking
Compute) and the epsilon it shows must equal ``privdl account decor ... --json``'s for the same
settings (ten settings), a permalink must restore the settings, bad input must show a message,
and the page must fit a phone-width window. Needs Debian's ``chromium`` and ``chromium-driver``
and Selenium (``.ci/run`` installs them); skipped with the reason otherwise. Run with
``pytest -m browser tests/serve/test_browser.py``; with ``PRIVDL_SCREENSHOTS=DIR`` the page's
screenshots at laptop and phone width are written there (docs/serve.md shows them).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from serve_helpers import cli_json

pytestmark = pytest.mark.browser

DECOR_SETTINGS = [  # graph, sigma_cdp, sigma_cor, clip, steps, delta, threat model, q
    ("ring:16", "1", "10", "1", "100", "1e-5", "eavesdropper", ""),
    ("ring:16", "2", "5", "1", "500", "1e-6", "curious", ""),
    ("torus:4x4", "1", "10", "0.5", "100", "1e-5", "curious", ""),
    ("torus:5x5", "0.5", "20", "1", "1000", "1e-5", "eavesdropper", ""),
    ("complete:8", "1", "3", "1", "200", "1e-5", "collusion", "2"),
    ("regular:20:4:1", "1", "8", "1", "300", "1e-7", "curious", ""),
    ("grid:3x4", "1.5", "0", "1", "50", "1e-5", "eavesdropper", ""),
    ("ring:10", "1", "10", "2", "100", "1e-5", "ldp", ""),
    ("star:6", "1", "4", "1", "100", "1e-5", "eavesdropper", ""),
    ("er:12:0.5:3", "1", "6", "1", "100", "1e-4", "curious", ""),
]


def _browser_paths() -> tuple[str, str]:
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("browser test: selenium is not installed (pip install selenium)")
    binary = next((p for n in ("chromium", "chromium-browser", "google-chrome")
                   if (p := shutil.which(n))), None)  # fmt: skip
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.skip("browser test: no chromium + chromedriver on PATH "
                    "(apt-get install chromium chromium-driver)")  # fmt: skip
    return binary, driver


@pytest.fixture(scope="module")
def browser():
    binary, driver_path = _browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900"):  # fmt: skip
        opts.add_argument(arg)
    try:
        driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    except Exception as exc:  # a driver that does not match the browser, no display libs, ...
        pytest.skip(f"browser test: chromium did not start ({type(exc).__name__}: {exc})")
    yield driver
    driver.quit()


def _by_id(driver, name):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, name)


def _wait(driver, predicate, timeout=60):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(predicate)


def _type(driver, name, value):
    field = _by_id(driver, name)
    field.clear()
    field.send_keys(value)


def _choose(driver, name, value):
    from selenium.webdriver.support.ui import Select

    Select(_by_id(driver, name)).select_by_value(value)


def _compute(driver, result_id):
    """Click Compute and wait for a fresh result (or an error message)."""
    driver.execute_script(
        "document.getElementById('headline').replaceChildren();"
        "document.getElementById('error').hidden = true;"
    )
    _by_id(driver, "run").click()

    def finished(d):
        if d.find_elements("id", result_id):
            return "result"
        return "error" if _by_id(d, "error").is_displayed() else False

    return _wait(driver, finished)


def _fill_decor(driver, graph, sigma_cdp, sigma_cor, clip, steps, delta, adversary, q):
    _type(driver, "graph", graph)
    for name, value in (("sigma_cdp", sigma_cdp), ("sigma_cor", sigma_cor), ("clip", clip),
                        ("steps", steps), ("delta", delta)):  # fmt: skip
        _type(driver, name, value)
    _choose(driver, "adversary", adversary)
    if q:
        _type(driver, "q", q)


def _cli_decor(capsys, graph, sigma_cdp, sigma_cor, clip, steps, delta, adversary, q):
    adv = f"collusion:{q}" if adversary == "collusion" else adversary
    return cli_json(capsys, ["account", "decor", "--graph", graph, "--sigma-cdp", sigma_cdp,
                             "--sigma-cor", sigma_cor, "--clip", clip, "--steps", steps,
                             "--delta", delta, "--adversary", adv])  # fmt: skip


def test_page_epsilon_equals_cli_for_ten_settings(browser, base_url, capsys):
    browser.get(base_url + "/")
    _wait(browser, lambda d: _by_id(d, "fact-nodes").text == "16")  # ring:16's facts shown
    assert browser.execute_script(
        "return !document.getElementById('drawing').hasAttribute('hidden')"
    )
    for setting in DECOR_SETTINGS:
        _fill_decor(browser, *setting)
        assert _compute(browser, "decor-epsilon") == "result", _by_id(browser, "error").text
        shown = _by_id(browser, "decor-epsilon")
        cli = _cli_decor(capsys, *setting)
        assert float(shown.get_attribute("data-value")) == cli["epsilon"], setting
        assert float(shown.text) == pytest.approx(cli["epsilon"], rel=1e-5)  # 6 digits shown
        assert _by_id(browser, "decor-epsilon-label").text == cli["label"], setting
    # the threat-model table of the last setting: each row is the CLI's --adversary
    for threat in ("eavesdropper", "curious", "ldp"):
        row = _by_id(browser, f"eps-{threat}")
        want = _cli_decor(capsys, *DECOR_SETTINGS[-1][:6], threat, "")
        assert float(row.get_attribute("data-value")) == want["epsilon"], threat


def test_permalink_restores_the_settings(browser, base_url, capsys):
    setting = ("torus:3x4", "1.25", "7", "1", "250", "1e-6", "collusion", "2")
    browser.get(base_url + "/")
    _wait(browser, lambda d: _by_id(d, "fact-nodes").text == "16")
    _fill_decor(browser, *setting)
    assert _compute(browser, "decor-epsilon") == "result"
    link = _by_id(browser, "permalink").get_attribute("href")
    assert "sigma_cdp=1.25" in link and "graph=torus%3A3x4" in link
    browser.get(base_url + "/")  # a fresh page: the defaults
    _wait(browser, lambda d: _by_id(d, "fact-nodes").text == "16")
    assert _by_id(browser, "sigma_cdp").get_attribute("value") == "1"
    browser.get(link)  # the permalink: settings restored and computed
    _wait(browser, lambda d: d.find_elements("id", "decor-epsilon"))
    for name, value in zip(("graph", "sigma_cdp", "sigma_cor", "clip", "steps", "delta",
                            "adversary", "q"), setting, strict=True):  # fmt: skip
        assert _by_id(browser, name).get_attribute("value") == value, name
    shown = float(_by_id(browser, "decor-epsilon").get_attribute("data-value"))
    assert shown == _cli_decor(capsys, *setting)["epsilon"]


def test_bad_input_shows_a_message_and_the_server_answers_next(browser, base_url, tmp_path):
    browser.get(base_url + "/")
    _wait(browser, lambda d: _by_id(d, "fact-nodes").text == "16")
    bad = tmp_path / "loops.txt"
    bad.write_text("0 1\n1 2\n2 2\n")
    _by_id(browser, "upload").send_keys(str(bad))
    _wait(browser, lambda d: _by_id(d, "graph-error").is_displayed())
    assert _by_id(browser, "graph-error").text == "loops.txt:3: self-loop 2-2 is not allowed"
    nonint = tmp_path / "frac.txt"
    nonint.write_text("0 1\n1 2.5\n")
    _by_id(browser, "upload").send_keys(str(nonint))
    _wait(browser, lambda d: "non-integer" in _by_id(d, "graph-error").text)
    for name, value, words in [("sigma_cdp", "abc", "sigma_cdp: expected a number"),
                               ("sigma_cdp", "-2", "sigma_cdp must be > 0"),
                               ("delta", "1", "delta must lie in (0, 1)")]:  # fmt: skip
        _fill_decor(browser, "ring:16", "1", "10", "1", "100", "1e-5", "eavesdropper", "")
        _type(browser, name, value)
        assert _compute(browser, "decor-epsilon") == "error", (name, value)
        assert words in _by_id(browser, "error").text, (name, value, _by_id(browser, "error").text)
    _fill_decor(browser, "ring:100000000", "1", "10", "1", "100", "1e-5", "eavesdropper", "")
    assert _compute(browser, "decor-epsilon") == "error"
    assert "100,000,000 nodes" in _by_id(browser, "error").text
    split = tmp_path / "two.txt"  # accepted (its facts say so), refused where it matters
    split.write_text("0 1\n2 3\n")
    _by_id(browser, "upload").send_keys(str(split))
    _wait(browser, lambda d: _by_id(d, "fact-connected").text == "false")
    _fill_decor(browser, _by_id(browser, "graph").get_attribute("value"), "1", "10", "1", "100",
                "1e-5", "eavesdropper", "")  # fmt: skip
    assert _compute(browser, "decor-epsilon") == "error"
    assert "graph 'two.txt' is disconnected (2 components)" in _by_id(browser, "error").text
    # a good upload, and the next computation still answers
    good = tmp_path / "square.txt"
    good.write_text("0 1\n1 2\n2 3\n3 0\n")
    _by_id(browser, "upload").send_keys(str(good))
    _wait(browser, lambda d: _by_id(d, "graph").get_attribute("value").startswith("upload:"))
    _fill_decor(browser, _by_id(browser, "graph").get_attribute("value"), "1", "10", "1", "100",
                "1e-5", "eavesdropper", "")  # fmt: skip
    assert _compute(browser, "decor-epsilon") == "result"


def test_dpsgd_panel_equals_cli(browser, base_url, capsys):
    browser.get(base_url + "/")
    browser.find_element("css selector", "#tabs button[data-tab=dpsgd]").click()
    _wait(browser, lambda d: _by_id(d, "noise_multiplier").is_displayed())
    for name, value in (("noise_multiplier", "3"), ("d_sampling_rate", "1"), ("d_steps", "40"),
                        ("d_delta", "1e-6")):  # fmt: skip
        _type(browser, name, value)
    _choose(browser, "d_sampling", "none")
    assert _compute(browser, "dpsgd-epsilon") == "result", _by_id(browser, "error").text
    cli = cli_json(capsys, ["account", "dpsgd", "--noise-multiplier", "3", "--sampling-rate", "1",
                            "--steps", "40", "--delta", "1e-6", "--sampling", "none"])  # fmt: skip
    assert float(_by_id(browser, "dpsgd-epsilon").get_attribute("data-value")) == cli["epsilon"]
    assert _by_id(browser, "dpsgd-epsilon-label").text == cli["label"]
    assert len(browser.find_elements("css selector", "#compare tr")) == 5  # header + 4 accountants


def test_calibrate_and_nominal_panels_equal_cli(browser, base_url, capsys):
    browser.get(base_url + "/")
    _wait(browser, lambda d: _by_id(d, "fact-nodes").text == "16")
    browser.find_element("css selector", "#tabs button[data-tab=calibrate-decor]").click()
    _type(browser, "graph", "torus:4x4")
    for name, value in (("cal_epsilon", "5"), ("steps", "300"), ("delta", "1e-6")):
        _type(browser, name, value)
    assert _compute(browser, "cal-sigma-cor") == "result", _by_id(browser, "error").text
    cli = cli_json(capsys, ["calibrate", "decor", "--graph", "torus:4x4", "--epsilon", "5",
                            "--steps", "300", "--delta", "1e-6"])  # fmt: skip
    assert float(_by_id(browser, "cal-sigma-cor").get_attribute("data-value")) == cli["sigma_cor"]
    browser.find_element("css selector", "#tabs button[data-tab=plan]").click()
    _choose(browser, "plan", "porter")
    for name, value in (("plan_tau", "2"), ("plan_steps", "50"), ("plan_local_samples", "300"),
                        ("plan_epsilon", "2"), ("plan_delta", "1e-5")):  # fmt: skip
        _type(browser, name, value)
    assert _compute(browser, "plan-eps-accounted") == "result", _by_id(browser, "error").text
    cli = cli_json(capsys, ["plan", "porter", "--tau", "2", "--steps", "50", "--local-samples",
                            "300", "--epsilon", "2", "--delta", "1e-5"])  # fmt: skip
    for key in ("nominal", "accounted"):
        shown = float(_by_id(browser, f"plan-eps-{key}").get_attribute("data-value"))
        assert shown == cli[key]["epsilon"], key


def test_page_fits_laptop_and_phone_widths(browser, base_url):
    shots = os.environ.get("PRIVDL_SCREENSHOTS")
    for name, width, height in (("laptop", 1280, 900), ("phone", 390, 844)):
        browser.set_window_size(width, height)
        browser.get(base_url + "/?graph=torus%3A4x4&adversary=curious")
        _wait(browser, lambda d: d.find_elements("id", "decor-epsilon"))
        _wait(browser, lambda d: _by_id(d, "fact-nodes").text == "16")
        overflow = browser.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"{name}: the page is {overflow} px wider than the window"
        assert _by_id(browser, "run").is_displayed() and _by_id(browser, "sigma_cdp").is_displayed()
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            full = browser.execute_script("return document.body.scrollHeight")
            browser.set_window_size(width, min(full + 140, 4000))
            browser.save_screenshot(str(Path(shots) / f"serve-{name}.png"))
    browser.set_window_size(1280, 900)


def test_a_long_computation_shows_progress_and_can_be_cancelled(browser, base_url):
    """Last in the module: the cancelled job's current stage still finishes on the worker."""
    browser.get(base_url + "/")
    _wait(browser, lambda d: _by_id(d, "fact-nodes").text == "16")
    _fill_decor(browser, "torus:30x30", "1", "10", "1", "1000", "1e-5", "curious", "")
    _choose(browser, "unit", "example")  # subsampled: a PLD composition per stage
    _by_id(browser, "run").click()
    _wait(browser, lambda d: not _by_id(d, "cancel").get_attribute("disabled"))
    _wait(browser, lambda d: "SecRDP step" in _by_id(d, "status").text
          or "epsilon over" in _by_id(d, "status").text)  # fmt: skip
    _by_id(browser, "cancel").click()
    _wait(browser, lambda d: _by_id(d, "status").text == "cancelled", timeout=5)
    assert _by_id(browser, "cancel").get_attribute("disabled")
