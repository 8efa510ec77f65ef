"""The tear sheet in a real browser: Debian's Chromium, headless, driven by Playwright, opens ``report.html`` from a
file:// URL with every network request recorded (and any but the page's own refused). It must render without a
console error, show its title and every section heading, give every figure a size on screen, and ask for nothing but
itself: the page a user opens on a laptop offline.

Needs ``/usr/bin/chromium`` (``apt-get install -y chromium``; never ``playwright install``, which downloads a browser)
and the ``playwright`` package (requirements-dev.txt). Without them the test skips with the reason, except in CI
(``CI=true``), where ``.ci/run`` installs Chromium and a missing browser fails the test.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from offline import tearsheet
from tests.offline.tearsheet_builders import backtest_sheet, evaluation_sheet

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
BUILDERS = {"evaluate": evaluation_sheet, "backtest": backtest_sheet}


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing: apt-get install -y chromium"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is missing: pip install -r requirements-dev.txt"
    return None


@pytest.fixture(scope="module")
def browser():
    missing = _missing()
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI runs the browser test: {missing} (.ci/run installs Chromium)")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module", params=list(BUILDERS))
def opened(request, browser, tmp_path_factory):
    """One page per kind of report, opened once: the sheet, the page's URL, and what the browser saw loading it."""
    sheet = BUILDERS[request.param]()
    path = tmp_path_factory.mktemp("tearsheet") / tearsheet.PAGE
    tearsheet.write_page(path, sheet)
    url = path.resolve().as_uri()
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    seen = {"requests": [], "refused": [], "errors": []}

    def route(route):  # every request of the page goes through here: only its own file may load
        if route.request.url == url:
            route.continue_()
        else:
            seen["refused"].append(route.request.url)
            route.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("request", lambda r: seen["requests"].append(r.url))
    page.on("console", lambda message: seen["errors"].append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: seen["errors"].append(str(error)))
    page.goto(url, wait_until="load")
    page.wait_for_load_state("networkidle")
    try:
        yield sheet, url, page, seen
    finally:
        context.close()


def test_the_page_renders_its_title_without_errors(opened):
    sheet, _, page, seen = opened
    assert seen["errors"] == []
    assert page.title() == sheet.title
    assert page.locator("h1").inner_text() == sheet.title


def test_every_section_heading_is_shown(opened):
    sheet, _, page, _ = opened
    parts = page.locator("h2").all_inner_texts()
    assert parts == [sheet.verdict.heading, *(p.title for p in sheet.parts), tearsheet.DEFINITIONS]
    headings = page.locator("h3").all_inner_texts()
    assert headings == list(tearsheet.SECTIONS) * len(sheet.parts)
    assert all(page.locator("h3").nth(i).is_visible() for i in range(len(headings)))


def test_every_figure_has_a_size_on_screen(opened):
    _, _, page, _ = opened
    sizes = page.evaluate(
        """() => Array.from(document.querySelectorAll("figure, img")).map(element => {
            const box = element.getBoundingClientRect();
            return {tag: element.tagName, width: box.width, height: box.height,
                    decoded: element.tagName !== "IMG" || (element.complete && element.naturalWidth > 0)};
        })"""
    )
    images = [s for s in sizes if s["tag"] == "IMG"]
    assert len(images) >= 4 and len(sizes) == 2 * len(images)  # each image in its figure
    assert all(s["width"] > 0 and s["height"] > 0 and s["decoded"] for s in sizes), sizes
    tables = page.evaluate("() => Array.from(document.querySelectorAll('table')).map(t => t.rows.length)")
    assert tables and all(rows > 1 for rows in tables)  # a header and at least one row


def test_the_page_requests_nothing_but_itself(opened):
    _, url, page, seen = opened
    assert seen["requests"] == [url] and seen["refused"] == []
    # Nothing the page holds names anything to load: every image inline, every link an anchor of the page.
    sources = page.evaluate("() => Array.from(document.images).map(i => i.src.slice(0, 22))")
    assert set(sources) == {"data:image/png;base64,"}
    links = page.evaluate("() => Array.from(document.links).map(a => a.getAttribute('href'))")
    assert links and all(link.startswith("#") for link in links)
    assert page.evaluate("() => document.scripts.length + document.styleSheets.length") == 1  # the inline style
    # The file itself names no address (the page's text may, in words; this one does not): images aside, no http.
    text = Path(unquote(urlparse(url).path)).read_text(encoding="utf-8")
    assert not re.search(r"https?://", re.sub(r"data:image/png;base64,[A-Za-z0-9+/]+=*", "", text))
