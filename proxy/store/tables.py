"""The schema: SQLAlchemy Core tables that alembic migrations create and `write`/`read` use.

Bodies and raw objects are JSON (`json` on PostgreSQL, not `jsonb`, so a stored request keeps
its key order and reads back as the client wrote it). Timestamps are timezone-aware and always
UTC: `timestamptz` on PostgreSQL, ISO-like text (`2024-05-01 12:00:00.123456`) on SQLite, so
both sort and compare as time. Exchange ids are UUIDv7 strings, time-ordered.

`exchanges.request`/`response` and `usage.raw` are the source of truth; `completions`,
`choices`, `usage` columns and `logprobs` are projections of them kept for querying.
`raw_streams` keeps the exact bytes of a stream (gzip) and their timing, for playback.
`rollups` and `rollup_tags` hold the usage and cost of pruned exchanges, one row per day and
group (`proxy/store/rollups.py`).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

Json = sa.JSON(none_as_null=True)
Time = sa.DateTime(timezone=True)
ExchangeId = sa.String(36)


def _exchange_id() -> sa.Column[str]:
    """Child rows are keyed by their exchange and go when it is deleted."""
    return sa.Column(
        "exchange_id",
        ExchangeId,
        sa.ForeignKey("exchanges.id", ondelete="CASCADE"),
        primary_key=True,
    )


def _where(condition: str) -> dict[str, Any]:
    """A partial index's condition on both engines."""
    where = sa.text(condition)
    return {"sqlite_where": where, "postgresql_where": where}


def _where_set(column: str) -> dict[str, Any]:
    """Only rows where `column` has a value."""
    return _where(f"{column} IS NOT NULL")


exchanges = sa.Table(
    "exchanges",
    metadata,
    sa.Column("id", ExchangeId, primary_key=True),
    sa.Column("started_at", Time, nullable=False),
    sa.Column("method", sa.String(), nullable=False),
    sa.Column("path", sa.Text(), nullable=False),
    sa.Column("query", sa.Text(), nullable=False),
    sa.Column("upstream", sa.String(), nullable=False),
    sa.Column("upstream_url", sa.Text(), nullable=False),
    sa.Column("status", sa.Integer()),
    sa.Column("stream", sa.Boolean(), nullable=False),
    sa.Column("model", sa.String()),
    sa.Column("response_model", sa.String()),
    sa.Column("outcome", sa.String(), nullable=False),
    sa.Column("error", sa.Text()),
    sa.Column("request", Json),
    sa.Column("request_body", sa.LargeBinary()),
    sa.Column("request_omitted", sa.Boolean(), nullable=False),
    sa.Column("response", Json),
    sa.Column("response_body", sa.LargeBinary()),
    sa.Column("response_omitted", sa.Boolean(), nullable=False),
    sa.Column("response_bytes", sa.BigInteger(), nullable=False),
    sa.Column("content_type", sa.String()),
    sa.Column("ttfb_ms", sa.Double()),
    sa.Column("ttft_ms", sa.Double()),
    sa.Column("duration_ms", sa.Double()),
    sa.Column("chunks", sa.Integer(), nullable=False),
    sa.Column("upstream_request_id", sa.String()),
    sa.Column("key_hash", sa.String()),
    sa.Column("key_hint", sa.String()),
    sa.Column("end_user", sa.String()),
    sa.Column("replay_of", ExchangeId),
    sa.Column("usage_source", sa.String()),
    sa.Column("system_fingerprint", sa.String()),
    sa.Column("parse_errors", Json),
    sa.Column("cost_usd", sa.Double()),
    # Where the price came from, e.g. "genai-prices 0.2.3 openai/gpt-5 flex" (SPEC 5).
    sa.Column("price_entry", sa.String()),
    # Which `[[redact]]` rules matched, and what was not kept (migration 0005).
    sa.Column("redacted", Json),
    # The session the exchange belongs to (migration 0006).
    sa.Column("session", sa.String()),
    # What a next turn names and what this one names (`threads.py`, migration 0008).
    sa.Column("turn_key", sa.String()),
    sa.Column("parent_key", sa.String()),
    # The service tier the response reported, which chose the price (migration 0007).
    sa.Column("service_tier", sa.String()),
    sa.Index(None, "started_at"),
    sa.Index(None, "model", "started_at"),
    sa.Index(None, "key_hash", "started_at"),
    # Partial: most records have no user and are not replays (migration 0002).
    sa.Index(None, "end_user", "started_at", **_where_set("end_user")),
    sa.Index(None, "replay_of", **_where_set("replay_of")),
    sa.Index(None, "session", "started_at", **_where_set("session")),
    # Partial: only failures, what the console's error filters look for (migration 0003).
    sa.Index(None, "outcome", "started_at", **_where("outcome <> 'ok'")),
    sa.Index(None, "status", "started_at", **_where("status >= 400")),
    sa.Index(None, "turn_key", **_where_set("turn_key")),
)
EXCHANGE_AT = {str(column.name): at for at, column in enumerate(exchanges.columns)}
"""Where each column sits in an `exchanges` record: the recorder builds an exchange's row as
the drivers' tuple in the table's order (`store.rows`), and the writer's modules read it by
index."""

tags = sa.Table(
    "tags",
    metadata,
    _exchange_id(),
    sa.Column("key", sa.String(), primary_key=True),
    sa.Column("value", sa.String(), nullable=False),
    sa.Index(None, "key", "value"),
)

completions = sa.Table(
    "completions",
    metadata,
    _exchange_id(),
    sa.Column("completion_id", sa.String()),
    sa.Column("object", sa.String()),
    sa.Column("created", sa.BigInteger()),
    sa.Column("model", sa.String()),
    sa.Column("system_fingerprint", sa.String()),
    sa.Column("service_tier", sa.String()),
)

choices = sa.Table(
    "choices",
    metadata,
    _exchange_id(),
    sa.Column("choice_index", sa.Integer(), primary_key=True),
    sa.Column("role", sa.String()),
    sa.Column("content", sa.Text()),
    sa.Column("refusal", sa.Text()),
    sa.Column("finish_reason", sa.String()),
    sa.Column("tool_calls", Json),
    sa.Column("function_call", Json),
    sa.Column("audio", Json),
)

usage = sa.Table(
    "usage",
    metadata,
    _exchange_id(),
    sa.Column("prompt_tokens", sa.Integer()),
    sa.Column("completion_tokens", sa.Integer()),
    sa.Column("total_tokens", sa.Integer()),
    sa.Column("cached_tokens", sa.Integer()),
    sa.Column("prompt_audio_tokens", sa.Integer()),
    sa.Column("reasoning_tokens", sa.Integer()),
    sa.Column("completion_audio_tokens", sa.Integer()),
    sa.Column("accepted_prediction_tokens", sa.Integer()),
    sa.Column("rejected_prediction_tokens", sa.Integer()),
    sa.Column("raw", Json, nullable=False),
    # The token classes genai-prices prices apart (migration 0007).
    sa.Column("cache_write_tokens", sa.Integer()),
    sa.Column("cached_audio_tokens", sa.Integer()),
    sa.Column("prompt_image_tokens", sa.Integer()),
    sa.Column("cached_image_tokens", sa.Integer()),
    sa.Column("completion_image_tokens", sa.Integer()),
)

logprobs = sa.Table(
    "logprobs",
    metadata,
    _exchange_id(),
    sa.Column("choice_index", sa.Integer(), primary_key=True),
    sa.Column("kind", sa.String(), primary_key=True),
    sa.Column("position", sa.Integer(), primary_key=True),
    sa.Column("token", sa.Text(), nullable=False),
    sa.Column("logprob", sa.Double()),
    sa.Column("bytes", Json),
    sa.Column("top_logprobs", Json),
)

raw_streams = sa.Table(
    "raw_streams",
    metadata,
    _exchange_id(),
    sa.Column("gz", sa.LargeBinary(), nullable=False),
    sa.Column("pacing", Json),
)

fingerprints = sa.Table(
    "fingerprints",
    metadata,
    sa.Column("upstream", sa.String(), primary_key=True),
    sa.Column("model", sa.String(), primary_key=True),
    sa.Column("system_fingerprint", sa.String(), primary_key=True),
    sa.Column("first_seen", Time, nullable=False),
    sa.Column("last_seen", Time, nullable=False),
    sa.Column("count", sa.BigInteger(), nullable=False),
)

rollups = sa.Table(
    "rollups",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("day", Time, nullable=False),
    sa.Column("upstream", sa.String(), nullable=False),
    sa.Column("model", sa.String()),
    sa.Column("response_model", sa.String()),
    sa.Column("key_hash", sa.String()),
    sa.Column("key_hint", sa.String()),
    sa.Column("end_user", sa.String()),
    sa.Column("requests", sa.BigInteger(), nullable=False),
    sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
    sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
    sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
    sa.Column("reasoning_tokens", sa.BigInteger(), nullable=False),
    sa.Column("cost_nano", sa.BigInteger(), nullable=False),
    sa.Column("priced", sa.BigInteger(), nullable=False),
    sa.Column("unpriced", sa.BigInteger(), nullable=False),
    sa.Index(None, "day"),
)
"""Pruned exchanges summed per UTC day (`day` is its midnight) and group; `id` is a digest
of the group (day, upstream, models, key, user, tags) so a later prune adds to the same row."""

rollup_tags = sa.Table(
    "rollup_tags",
    metadata,
    # `rollups.id`, without a foreign key: only `prune` writes either table, and PostgreSQL
    # checked the key with the plan it made when `rollups` was empty, a scan of it per row.
    sa.Column("rollup_id", sa.String(32), primary_key=True),
    sa.Column("key", sa.String(), primary_key=True),
    sa.Column("value", sa.String(), nullable=False),
    sa.Index(None, "key", "value"),
)

alert_state = sa.Table(
    "alert_state",
    metadata,
    sa.Column("alert", sa.String(), primary_key=True),
    sa.Column("group_key", sa.String(), primary_key=True),
    sa.Column("state", sa.String(), nullable=False),
    sa.Column("value", sa.Double()),
    sa.Column("threshold", sa.Double()),
    sa.Column("detail", sa.Text()),
    sa.Column("changed_at", Time, nullable=False),
)
"""One row per alert (or budget) and group: `ok`, `firing`, or a budget's level (`50`, `80`,
`100`). Moved only by a compare-and-set update (`proxy/alerts/state.py`), so that of all the
processes sharing the database, one delivers each crossing (migration 0009)."""

alert_events = sa.Table(
    "alert_events",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("at", Time, nullable=False),
    sa.Column("alert", sa.String(), nullable=False),
    sa.Column("group_key", sa.String(), nullable=False),
    sa.Column("state", sa.String(), nullable=False),
    sa.Column("previous", sa.String(), nullable=False),
    sa.Column("value", sa.Double()),
    sa.Column("threshold", sa.Double()),
    sa.Column("detail", sa.Text()),
    sa.Index(None, "at"),
)
"""Every move of an `alert_state` row: what the console's `/alerts` lists as past alerts."""

LATENCY_BOUNDS_MS = tuple(round(25 * 2 ** (i / 2)) for i in range(27))
"""Upper bounds of the latency histogram's buckets (ms, a factor of about 1.41 apart, 25 ms to
205 s); the last bucket holds everything above. A percentile read from them is within that
factor: `facets.percentile` interpolates inside the bucket."""
HISTOGRAM = len(LATENCY_BOUNDS_MS) + 1
DURATION_COLUMNS = tuple(f"d{i}" for i in range(HISTOGRAM))
TTFT_COLUMNS = tuple(f"t{i}" for i in range(HISTOGRAM))
FACET_SUMS = (
    "requests",
    "errors",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cost_nano",
    "priced",
    "unpriced",
    *DURATION_COLUMNS,
    *TTFT_COLUMNS,
)

FACET_TOP = ("value", "hint", "requests", "errors", "cost_nano", "priced", "unpriced")
"""What the top lists read of a facet row."""

facets = sa.Table(
    "facets",
    metadata,
    sa.Column("dim", sa.String(), primary_key=True),
    sa.Column("span", sa.String(4), primary_key=True),
    sa.Column("start", Time, primary_key=True),
    sa.Column("value", sa.String(), primary_key=True),
    sa.Column("hint", sa.String()),
    *(sa.Column(name, sa.BigInteger(), nullable=False) for name in FACET_SUMS),
    # A filter reads one value's rows; the top lists read every value of a range, from this
    # index alone (the histograms make the rows themselves wide).
    sa.Index(None, "dim", "value", "span", "start"),
    sa.Index("ix_facets_top", "dim", "span", "start", *FACET_TOP),
    # SQLite keeps the rows in key order: a range of one facet is read in one pass.
    sqlite_with_rowid=False,
)
"""The writer's running sums for the overview (migration 0008): per UTC hour and per UTC day
(`span`), per facet (`dim`: `all`, `upstream`, `model` (answering, else requested),
`model_any` (each of the two), `key` (its hash; `hint` beside it), `user`, `tag` (`k=v`)) and
its `value`. Written in the transaction that inserts the exchanges (`facets.py`), so a
dashboard reads a few rows per bucket, never the exchanges."""

# The Batch API (SPEC 12, migration 0011): what passed through the proxy of a batch's files.

batch_requests = sa.Table(
    "batch_requests",
    metadata,
    sa.Column("input_file_id", sa.String(), primary_key=True),
    sa.Column("custom_id", sa.String(), primary_key=True),
    sa.Column("line", sa.Integer(), nullable=False),
    sa.Column("method", sa.String()),
    sa.Column("url", sa.String()),
    sa.Column("model", sa.String()),
    sa.Column("body", Json),
    sa.Column("exchange_id", ExchangeId, nullable=False),
)
"""The lines of an uploaded batch input file (`POST /files`, purpose `batch`), by file and
`custom_id`; `exchange_id` is the upload's."""

batches = sa.Table(
    "batches",
    metadata,
    sa.Column("id", sa.String(), primary_key=True),
    sa.Column("status", sa.String()),
    sa.Column("endpoint", sa.String()),
    sa.Column("input_file_id", sa.String()),
    sa.Column("output_file_id", sa.String()),
    sa.Column("error_file_id", sa.String()),
    sa.Column("created_at", Time),
    sa.Column("seen_at", Time, nullable=False),
    sa.Column("request_counts", Json),
    sa.Column("exchange_id", ExchangeId, nullable=False),
    sa.Index(None, "input_file_id"),
    sa.Index(None, "output_file_id"),
    sa.Index(None, "error_file_id"),
)
"""Each batch as last seen through the proxy (`POST /batches`, `GET /batches[/{id}]`, cancel);
`exchange_id` is the exchange it was last seen in."""

batch_results = sa.Table(
    "batch_results",
    metadata,
    # The output line's own id (`batch_req_...`): a result is booked once, whoever downloads
    # its file and however often. No foreign key to `exchanges`: the booking outlives a prune.
    sa.Column("line_id", sa.String(), primary_key=True),
    sa.Column("file_id", sa.String(), nullable=False),
    sa.Column("batch_id", sa.String()),
    sa.Column("custom_id", sa.String()),
    sa.Column("exchange_id", ExchangeId, nullable=False),
    sa.Column("booked_at", Time, nullable=False),
    sa.Index(None, "file_id"),
    sa.Index(None, "batch_id", "custom_id"),
    sa.Index(None, "exchange_id"),
)
"""One row per result line of a batch's output or error file, booked as the exchange
`exchange_id`; `batch_id` is filled once the batch naming the file has been seen."""
