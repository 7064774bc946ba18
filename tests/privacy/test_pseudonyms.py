"""With the `email` preset, e-mail user ids become stable pseudonyms, not one
`[REDACTED:email]`: `flightrec cost --by user` (a real process) keeps the users apart, the
stored request says the same pseudonym, and a later start (the key kept beside the journal)
gives the same user the same pseudonym."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import stat
import sys
from dataclasses import replace
from pathlib import Path

import openai
import orjson

from proxy.config import Config, ConfigError
from proxy.privacy.pseudonym import Pseudonyms
from proxy.privacy.redact import parse_rules
from proxy.relay.app import build_app, make_runner
from proxy.store import upgrade
from proxy.store.read import get_exchange, reading
from proxy.store.recorder import DatabaseRecorder
from tests import dbs
from tests.conftest import FakeUpstream, start_site
from tests.recordings import KEY, config_for


async def _chat(config: Config, user: str, header: bool) -> str:
    """One chat through a real proxy (a start of its own) for `user`, given as the request's
    `user` or as `X-Flightrec-User`; the exchange's id."""
    app = build_app(config, DatabaseRecorder(config))
    runner = make_runner(app, config)
    await runner.setup()
    client = openai.AsyncOpenAI(base_url=await start_site(runner) + "/v1", api_key=KEY)
    try:
        extra = {"X-Flightrec-User": user} if header else {}
        body = {} if header else {"user": user}
        raw = await client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers=extra,
            extra_body=body,
        )
        return raw.headers["X-Flightrec-Id"]
    finally:
        await client.close()
        await runner.cleanup()


def _pseudonym(key: bytes, address: str) -> str:
    return "[email:" + hmac.new(key, address.encode(), hashlib.sha256).hexdigest()[:12] + "]"


async def test_email_user_ids_stay_apart_as_stable_pseudonyms(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    url = dbs.sqlite_url(tmp_path / "u.db")
    await upgrade(url)
    rules = parse_rules([{"preset": "email"}], ConfigError)
    config = replace(config_for(url, upstream.url, tmp_path), redact=rules)
    ann = await _chat(config, "ann@example.com", header=False)
    bob = await _chat(config, "bob@example.com", header=True)
    ann_again = await _chat(config, "ann@example.com", header=True)  # a later start

    key_file = tmp_path / "flightrec.key"  # beside the journal, test.spool
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_bytes().strip()
    assert len(key) == 64
    ann_is, bob_is = _pseudonym(key, "ann@example.com"), _pseudonym(key, "bob@example.com")
    async with reading(url) as engine:
        shown = {i: await get_exchange(engine, i) for i in (ann, bob, ann_again)}
    assert [shown[i]["user"] for i in (ann, bob, ann_again)] == [ann_is, bob_is, ann_is]
    assert shown[ann]["request"]["user"] == ann_is
    assert shown[ann]["redacted"] == {"rules": ["email"]}
    assert b"example.com" not in orjson.dumps(shown)

    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "cost", "--by", "user", "--format", "json", "--db", url,
        env={k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")},
        stdout=-1, stderr=-1,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err
    requests = {row["group"]: row["requests"] for row in orjson.loads(out)}
    assert requests == {ann_is: 2, bob_is: 1}


def test_a_configured_key_is_used_and_no_file_is_made(tmp_path: Path) -> None:
    made = Pseudonyms("shared-secret", str(tmp_path / "j.spool"))
    expected = _pseudonym(b"shared-secret", "ann@example.com")
    assert made("email", "ann@example.com") == expected
    assert not (tmp_path / "flightrec.key").exists()
