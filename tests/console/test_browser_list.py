"""The exchange list in a real browser (Debian's Chromium): the errors filter, sorting by a
column, live tail (off by default; on, a newly recorded exchange appears without a reload and
stays text), and key names from `[keys]` in the list, its filter, the overview and the
exchange page."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from proxy.store.migrate import upgrade
from tests import dbs
from tests.console.test_browser import CHROMIUM
from tests.console.test_browser_dashboard import clean, page, shot
from tests.console.test_overview import traffic, write
from tests.console_data import HOSTILE, build, console_app

page = page  # fixture
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason=f"no Chromium at {CHROMIUM}")
NAMES = {"sk-...aaaa": "ci-bot"}


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    url = dbs.sqlite_url(tmp_path / "list.db")
    await upgrade(url)
    await write(url, traffic(time.time()) + build().all())
    server = TestServer(console_app(url, keys=NAMES))
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), url
    finally:
        await server.close()


async def api_ids(page: Any, root: str, query: str) -> list[str]:
    response = await page.request.get(f"{root}/api/exchanges?limit=500&{query}")
    assert response.ok, await response.text()
    return [item["id"] for item in (await response.json())["items"]]


async def shown_ids(page: Any) -> list[str]:
    rows = page.locator("table.list tbody tr")
    return [await rows.nth(i).get_attribute("data-id") for i in range(await rows.count())]


async def test_errors_filter_and_sorting(page: Any, site: tuple[str, str]) -> None:
    root, _ = site
    await page.goto(root + "/exchanges?limit=500")
    await page.select_option("select[name=outcome]", "error")
    await page.click("form.filters button[type=submit]")
    await page.wait_for_url("**/exchanges?*outcome=error*")
    failed = await api_ids(page, root, "outcome=error")
    assert await shown_ids(page) == failed and len(failed) == 10
    assert "10 requests" in await page.locator("p.summary").inner_text()
    await page.goto(root + "/exchanges?limit=500&status=5xx")
    assert await shown_ids(page) == await api_ids(page, root, "status=5xx")
    assert len(await shown_ids(page)) == 9  # every upstream_error of `traffic` is a 500

    await page.goto(root + "/exchanges?limit=500")
    await page.click("table.list th a:text('Cost')")
    await page.wait_for_url("**/exchanges?limit=500&sort=cost")
    by_cost = await api_ids(page, root, "sort=cost")
    assert await shown_ids(page) == by_cost
    costs = await page.locator("table.list tbody td:nth-child(7)").all_inner_texts()
    priced = [float(c.lstrip("$")) for c in costs if c.startswith("$")]
    assert priced == sorted(priced, reverse=True) and priced[0] > priced[-1]
    await page.click("table.list th a:text('When')")
    await page.wait_for_url("**/exchanges?limit=500")
    await page.click("table.list th a:text('When')")
    await page.wait_for_url("**/exchanges?*sort=oldest")
    assert await shown_ids(page) == list(reversed(await api_ids(page, root, "")))
    await shot(page, "list-sorted")


async def test_live_tail(page: Any, site: tuple[str, str]) -> None:
    root, url = site
    await page.goto(root + "/exchanges")
    await page.evaluate("window.loadedOnce = true")
    before = await shown_ids(page)
    quiet = dbs.chat_exchange(user="quiet")
    await dbs.store(url, [quiet])
    await page.wait_for_timeout(2500)
    assert await shown_ids(page) == before  # off by default
    await page.check("#live")
    row = page.locator(f"table.list tr[data-id='{quiet.id}']")
    await row.wait_for(timeout=10_000)
    fresh = dbs.chat_exchange(user=HOSTILE, tags={"x": HOSTILE})
    await dbs.store(url, [fresh])
    newest = page.locator("table.list tbody tr").first
    await page.locator(f"table.list tr[data-id='{fresh.id}']").wait_for(timeout=10_000)
    assert await newest.get_attribute("data-id") == fresh.id
    assert HOSTILE in await newest.locator("td.user").inner_text()  # shown as text
    assert await page.evaluate("window.loadedOnce") is True  # no reload
    await clean(page)
    await page.uncheck("#live")


async def test_key_names(page: Any, site: tuple[str, str]) -> None:
    root, _ = site
    await page.goto(root + "/exchanges?limit=500&key=ci-bot")
    named = await shown_ids(page)
    assert named == await api_ids(page, root, "key=sk-...aaaa") and len(named) == 31
    keys = await page.locator("table.list tbody td.key").all_inner_texts()
    assert set(keys) == {"ci-bot"}
    await page.goto(root + "/")
    assert "ci-bot (sk-...aaaa)" in await page.locator("table.top-key").inner_text()
    await page.goto(f"{root}/exchanges/{named[0]}")
    assert "ci-bot sk-...aaaa" in await page.locator("dl.facts").inner_text()
