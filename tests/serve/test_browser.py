"""The calculator page in a real browser: headless Chromium (Debian's ``chromium``) driven by Playwright against
``kvpools serve`` on 127.0.0.1, as a person uses it — pick a preset, fill the form, read the numbers — and the
numbers compared with the API's; then the link, a pasted config.json, and the page without JavaScript.

A screenshot of the answered page is written to the test's temporary folder, and to ``$KVPOOLS_SCREENSHOT`` when
set (``nox -s serve`` writes ``docs/img/serve.png``, the README's picture).  Skips, saying why, where Playwright or
a Chromium is not installed (``apt-get install chromium``; Playwright's own browser download needs a network).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serve.conftest import EXTRA

pytest.importorskip("fastapi", reason=EXTRA)
uvicorn = pytest.importorskip("uvicorn", reason=EXTRA)
try:
    from playwright import sync_api
except ImportError:
    if os.environ.get("KVPOOLS_REQUIRE_BROWSER") == "1":
        pytest.fail(
            "KVPOOLS_REQUIRE_BROWSER=1, but playwright is not installed (nox -s serve installs it)", pytrace=False
        )
    pytest.skip("playwright is not installed (nox -s serve installs it)", allow_module_level=True)

REQUIRED = os.environ.get("KVPOOLS_REQUIRE_BROWSER") == "1"
"""CI (``.ci/run``) sets it: there a missing browser or Playwright fails the session instead of skipping the page."""
CHROMIUM = os.environ.get("KVPOOLS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and REQUIRED:
    pytest.fail("KVPOOLS_REQUIRE_BROWSER=1 but no Chromium: apt-get install chromium", pytrace=False)
if CHROMIUM is None:
    pytest.skip(
        "no Chromium on this machine (apt-get install chromium, or set KVPOOLS_CHROMIUM to a Chromium binary); "
        "Playwright's own browser download is not used: it needs a network this machine may not have",
        allow_module_level=True,
    )
FLAGS = [
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",  # no connection leaves the machine: the page must work offline
    "--disable-component-update",
    "--disable-sync",
]
CONTEXTS = ["8k", "32k", "128k"]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """``kvpools serve``'s app under uvicorn on a free loopback port, for this module."""
    from kvpools_core.serve.app import create_app

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()


def api(server: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        server + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["result"]


def ladder(page: Any) -> list[tuple[int, int]]:
    rows = page.locator("#ladder tbody tr")
    return [
        (int(rows.nth(i).get_attribute("data-context")), int(rows.nth(i).get_attribute("data-concurrent")))
        for i in range(rows.count())
    ]


def answered(page: Any) -> None:
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_selector("#answer, .error")


def test_the_page_shows_the_apis_numbers(server: str, browser: Any, tmp_path: Path) -> None:
    expected = api(server, "/api/v1/capacity", {"model": "gpt-oss-20b", "gpu": "h100", "contexts": CONTEXTS})
    page = browser.new_page(viewport={"width": 1180, "height": 900})
    page.goto(server + "/")
    page.select_option("#model", "gpt-oss-20b")
    page.select_option("#gpu", "h100")
    page.fill("#contexts", ",".join(CONTEXTS))
    page.click("#go")
    answered(page)
    assert ladder(page) == [(row["context_len"], row["concurrent_requests"]) for row in expected["ladder"]]
    assert page.inner_text("#tokens-full b") == f"{expected['counts']['tokens']['full']:,}"
    assert page.inner_text("#tokens-swa b") == f"{expected['counts']['tokens']['swa']:,}"
    assert page.inner_text("#launch") == expected["launch"]
    assert page.locator("#chart-concurrency rect.bar").count() == len(CONTEXTS)
    assert page.locator("#chart-memory rect").count() == 6  # runtime, weights, slack, reserved, KV pools, unused
    assert "model=gpt-oss-20b" in page.url and "gpu=h100" in page.url  # the state is in the URL
    shot = tmp_path / "serve.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("KVPOOLS_SCREENSHOT"):
        page.screenshot(path=os.environ["KVPOOLS_SCREENSHOT"], full_page=True)

    again = browser.new_page()
    again.goto(page.url)  # the link reproduces the page
    answered(again)
    assert ladder(again) == ladder(page)
    assert again.input_value("#contexts") == ",".join(CONTEXTS)
    again.close()
    page.close()


def test_a_pasted_config_plans_as_its_preset(server: str, browser: Any) -> None:
    from kvpools_core.models import registry_presets
    from kvpools_core.registry import get_registry

    config = Path(registry_presets(get_registry())["llama-3.1-8b"][1]).read_text()
    expected = api(server, "/api/v1/capacity", {"model": "llama-3.1-8b", "memory": "40GiB", "contexts": ["8k"]})
    page = browser.new_page()
    page.goto(server + "/")
    page.select_option("#gpu", "")
    page.fill("#memory", "40GiB")
    page.fill("#contexts", "8k")
    page.click("#config-box summary")
    page.fill("#config", config)
    page.click("#go")
    answered(page)
    assert ladder(page) == [(8192, expected["ladder"][0]["concurrent_requests"])]
    assert page.inner_text("#tokens-full b") == f"{expected['counts']['tokens']['full']:,}"
    page.close()


def test_without_javascript_the_form_is_answered_by_the_server(server: str, browser: Any) -> None:
    expected = api(server, "/api/v1/capacity", {"model": "llama-3.1-8b", "gpu": "h100", "contexts": ["8k", "32k"]})
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.goto(server + "/")
    page.select_option("#model", "llama-3.1-8b")
    page.select_option("#gpu", "h100")
    page.fill("#contexts", "8k,32k")
    page.click("#go")
    page.wait_for_selector("#answer")
    cells = page.locator("table.ladder tbody tr td:nth-child(2)").all_inner_texts()
    assert cells == [f"{row['concurrent_requests']:,}" for row in expected["ladder"]]
    context.close()
