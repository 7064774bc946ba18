"""`bench.keepup` run for real at a toy size: a mock upstream, `flightrec serve` on a real
database and the load generator as child processes. Checks that what it counts adds up (every
request it sent is written, the windows and the backlog come out), never how fast anything is."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletion
from sqlalchemy.engine import make_url

from bench import keepup
from bench.upstream import logprobs_response
from tests.dbs import PG_ENV


def pg_host() -> str:
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{PG_ENV} is not set: PostgreSQL tests skipped")
    url = make_url(base)
    return f"{url.host or '127.0.0.1'}:{url.port or 5432}"


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_busy_spell_is_counted_and_every_request_written(tmp_path: Path, engine: str) -> None:
    pg = pg_host() if engine == "postgresql" else "127.0.0.1:5432"
    out = tmp_path / "keepup.json"
    argv = ["--engine", engine, "--concurrency", "4", "--seconds", "2", "--every", "0.5"]
    argv += ["--rounds", "1", "--pg", pg, "--catch-up-limit", "30", "--json", str(out)]
    assert keepup.main(argv) == 0
    found = json.loads(out.read_text())
    name = "flightrec-sqlite" if engine == "sqlite" else "flightrec-postgres"
    (run,) = found["rounds"][name]
    assert run["all_written"] and run["errors"] == 0
    assert run["served_per_s"] > 0
    assert run["written_per_s"] and all(rate >= 0 for rate in run["written_per_s"])
    assert run["not_written_at_end"] >= 0 and run["catch_up_s"] < 30
    assert found["medians"][name]["served_per_s"] == run["served_per_s"]


def test_the_mock_upstreams_logprobs_are_what_the_sdk_reads() -> None:
    """The responses `--logprobs` asks for parse as the `openai` SDK's own type, each token
    with its alternatives, as the recorder stores them."""
    raw = logprobs_response({"logprobs": True, "top_logprobs": 5, "max_tokens": 7})
    body = raw.split(b"\r\n\r\n", 1)[1]
    completion = ChatCompletion.model_validate_json(body)
    tokens = completion.choices[0].logprobs.content  # type: ignore[union-attr]
    assert tokens is not None and len(tokens) == 7
    assert all(len(token.top_logprobs) == 5 for token in tokens)
    assert completion.usage is not None and completion.usage.completion_tokens == 7
