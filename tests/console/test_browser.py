"""The console in a real browser (headless Chromium driven by Playwright): click through list ->
filter -> exchange -> logprobs hover -> replay diff -> cost, checking what is on screen against
the database; and prove that no script from recorded content runs.

Playwright cannot download its own browser here: it drives Debian's `chromium`
(`apt-get install chromium`; `.ci/run` installs it when it can). Without it these tests skip.
Set FLIGHTREC_CONSOLE_SCREENSHOTS=DIR to keep screenshots of the pages visited.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from proxy.store.read import reading
from proxy.store.report import cost_report, total, usd
from tests.console_data import HOSTILE, Seeded, build, console_app, write
from tests.dbs import sqlite_url

CHROMIUM = os.environ.get("FLIGHTREC_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
playwright_api = pytest.importorskip("playwright.async_api", reason="pip install playwright")
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).is_file(),
    reason=f"no Chromium at {CHROMIUM}: apt-get install chromium (or set FLIGHTREC_CHROMIUM)",
)


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[tuple[str, Seeded, str]]:
    url = sqlite_url(tmp_path / "browser.db")
    seeded = build()
    await write(url, seeded.all())
    server = TestServer(console_app(url))
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), seeded, url
    finally:
        await server.close()


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Any]:
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            yield await context.new_page()
        finally:
            await browser.close()


async def shot(page: Any, name: str) -> None:
    folder = os.environ.get("FLIGHTREC_CONSOLE_SCREENSHOTS")
    if folder:
        await page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


async def test_click_through_the_console(page: Any, site: tuple[str, Seeded, str]) -> None:
    root, s, db = site
    await page.goto(root + "/exchanges")
    rows = page.locator("table.list tbody tr")
    assert await rows.count() == len(s.all())
    assert "house-model-9" in await rows.nth(1).inner_text()  # newest first
    await shot(page, "list")

    await page.fill("input[name=user]", "cat")
    await page.click("form.filters button[type=submit]")
    await page.wait_for_url("**/exchanges?*user=cat*")
    assert await rows.count() == 2
    await page.click(f"a[href='/exchanges/{s.original.id}']")
    await page.wait_for_url(f"**/exchanges/{s.original.id}")
    answer = page.locator("section:has(h2:text-is('Answer')) pre.text")
    assert await answer.inner_text() == "Blue, grey and orange at dusk."
    await page.click(f"a[href='/exchanges/{s.replay.id}/diff']")
    await page.wait_for_url("**/diff")
    assert await page.locator(".diff-left del").all_inner_texts() == ["grey", "orange"]
    assert await page.locator(".diff-right ins").all_inner_texts() == ["white", "red"]
    finish = page.locator("table.compare tr:has(th:text-is('Finish reason'))")
    assert "differs" in await finish.inner_text()
    await shot(page, "diff")

    await page.goto(f"{root}/exchanges/{s.stream.id}")
    token = page.locator(".tok").nth(1)
    tip = token.locator(".tip")
    assert not await tip.is_visible()
    await token.hover()
    assert await tip.is_visible()
    assert f"{100 * math.exp(-0.25):.1f}%" in await tip.inner_text()  # " sky": logprob -0.25
    assert await page.locator("svg.timeline line.ttft").count() == 1
    await shot(page, "exchange")

    await page.click("header nav a:text-is('Cost')")
    await page.wait_for_url("**/cost")
    async with reading(db) as engine:
        expected = usd(total(await cost_report(engine, "model"))["cost_usd"])
    assert await page.locator("#total-cost").inner_text() == f"${expected}"
    unpriced = page.locator("table.report tr:has-text('house-model-9')")
    assert "unpriced" in await unpriced.inner_text()
    await shot(page, "cost")


async def test_recorded_content_never_runs(page: Any, site: tuple[str, Seeded, str]) -> None:
    root, s, _ = site
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> Any:
        dialogs.append(dialog.message)
        return dialog.dismiss()

    page.on("dialog", on_dialog)
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    for path in (
        "/",
        f"/exchanges/{s.hostile.id}",
        f"/exchanges?user={HOSTILE[:20]}",
        "/fingerprints",
    ):
        await page.goto(root + path)
        await page.wait_for_load_state("load")
        assert await page.evaluate("typeof window.pwned") == "undefined"
        assert await page.title() != "pwned"
    await page.goto(f"{root}/exchanges/{s.hostile.id}")
    shown = await page.locator("section:has(h2:text-is('Conversation')) pre.text").inner_text()
    assert shown == HOSTILE
    link = page.locator("a:text-is('click me')")
    assert await link.count() == 0  # the recorded <a> is text, not a link
    assert page.url.startswith(root) and dialogs == []


async def test_a_logprob_tooltip_stays_on_screen(page: Any, site: tuple[str, Seeded, str]) -> None:
    """The last token of a line sits near the right edge: its tooltip opens leftwards."""
    root, s, _ = site
    await page.set_viewport_size({"width": 220, "height": 700})
    await page.goto(f"{root}/exchanges/{s.stream.id}")
    tokens = page.locator(".tok")
    assert await tokens.count() == 4
    for n in range(4):
        await tokens.nth(n).hover()
        tip = tokens.nth(n).locator(".tip")
        box = await tip.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 220, n
