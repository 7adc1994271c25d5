"""The web page in a real headless Chromium (Debian's chromium + chromium-driver).

Skips, saying why, where Chromium, its driver or selenium is missing; `.ci/run` installs them.
Set WTNMT_SCREENSHOT=FILE.png to keep the screenshot the test takes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from helpers import sentence
from serving import LiveServer, shared_tiny_run
from wtnmt import Translator
from wtnmt.model import branch_weight_table
from wtnmt.serve.app import create_app
from wtnmt.serve.settings import ServeSettings

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
if CHROMIUM is None or DRIVER is None:
    pytest.skip(
        "no Chromium here: apt-get install chromium chromium-driver", allow_module_level=True
    )

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # headless, as root in a container, on a machine whose network is closed
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1500",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))
    yield driver
    driver.quit()


def test_the_page_translates_as_you_type_and_shows_branches(browser, tmp_path, tmp_path_factory):
    run = shared_tiny_run(tmp_path_factory)
    translator = Translator.load(run)
    text = sentence(50_000, 4)
    expected = translator.translate([text])[0]
    table = branch_weight_table(translator.model)
    app = create_app(Translator.load(run), ServeSettings())
    # the page redraws what it shows as answers come: an element found may be replaced before
    # its text is read, and then the wait looks again
    wait = WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,))
    with LiveServer(app) as server:
        browser.get(server.url + "/")
        # the κ/α bars: every branched layer, κ and α, one bar per branch
        bars = wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#bars .bar") or None)
        assert len(bars) == sum(2 * len(w["kappa"]) for w in table.values())
        first = table["encoder_layers.0.self_attn"]["kappa"]
        shown = [bar.get_attribute("title") for bar in bars[: len(first)]]
        assert shown == [f"κ{i + 1} = {k:.4f}" for i, k in enumerate(first)]

        browser.find_element(By.ID, "src").send_keys(text)  # no button: it translates itself
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#out .out-line .text"))
        out = browser.find_element(By.CSS_SELECTOR, "#out .out-line .text")
        assert out.text == expected

        # one attention map per branch of the chosen decoder layer, titled with its κ and α
        maps = wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#attn svg.attn-map"))
        assert len(maps) == 4
        pieces = len(translator.encode([text])[0]) + 1
        rows = len(translator.translate_nbest([text])[0][0].ids) + 1
        assert len(maps[0].find_elements(By.TAG_NAME, "rect")) == rows * pieces
        titles = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#attn .title")]
        cross = table["decoder_layers.0.cross_attn"]
        assert titles[0] == f"branch 1 · κ {cross['kappa'][0]:.3f} · α {cross['alpha'][0]:.3f}"

        browser.find_element(By.CSS_SELECTOR, '#layer-buttons [data-layer="1"]').click()
        cross = table["decoder_layers.1.cross_attn"]
        want = f"branch 1 · κ {cross['kappa'][0]:.3f} · α {cross['alpha'][0]:.3f}"
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#attn .title").text == want)

        # paper Table 3, live: the same sentence with uniform branch weights
        browser.find_element(By.CSS_SELECTOR, '#mode [data-mode="uniform"]').click()
        uniform = "branch 1 · κ 0.250 · α 0.250"
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#attn .title").text == uniform)
        assert "uniform branch weights" in browser.find_element(By.ID, "status").text
        # and in one sublayer alone: decoder layer 2's κ are the learned ones again
        browser.find_element(
            By.CSS_SELECTOR, '#where option[value="encoder_layers.0.self_attn"]'
        ).click()
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#attn .title").text == want)
        status = browser.find_element(By.ID, "status").text
        assert "uniform branch weights in encoder_layers.0.self_attn" in status
        translator.set_branch_weights("uniform", only=["encoder_layers.0.self_attn"])
        out = browser.find_element(By.CSS_SELECTOR, "#out .out-line .text")
        assert out.text == translator.translate([text])[0]

        shot = Path(os.environ.get("WTNMT_SCREENSHOT") or tmp_path / "page.png")
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        # the page asked for nothing outside the server
        hosts = browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => new URL(e.name).host)"
        )
        assert set(hosts) <= {server.url.removeprefix("http://")}


def test_a_pruned_model_shows_its_branches_numbered_as_in_the_trained_one(
    browser, tmp_path, tmp_path_factory
):
    from wtnmt.cli import main

    out = tmp_path / "pruned"
    run = shared_tiny_run(tmp_path_factory)
    assert main(["prune", str(run), "--out", str(out), "--keep-total", "6"]) == 0
    translator = Translator.load(out)
    kept = translator.config.model.kept_branches
    table = branch_weight_table(translator.model)
    wait = WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,))
    with LiveServer(create_app(translator, ServeSettings())) as server:
        browser.get(server.url + "/")
        bars = wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#bars .bar") or None)
        assert len(bars) == 2 * 6
        shown = [bar.get_attribute("title") for bar in bars]
        # some layer keeps other branches than its first ones, so their numbers show it
        assert any(list(k) != list(range(len(k))) for k in (*kept.encoder, *kept.decoder))
        weights = [
            f"{sym}{b} = {v:.4f}"
            for w, layer in zip(table.values(), (*kept.encoder, *kept.decoder), strict=True)
            for sym, kind in (("κ", "kappa"), ("α", "alpha"))
            for b, v in zip([b + 1 for b in layer], w[kind], strict=True)
        ]
        assert shown == weights

        browser.find_element(By.ID, "src").send_keys(sentence(50_000, 4))
        maps = wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#attn svg.attn-map"))
        assert len(maps) == len(kept.decoder[0])
        titles = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#attn .title")]
        assert [t.split(" · ")[0] for t in titles] == [f"branch {b + 1}" for b in kept.decoder[0]]
