"""Typed keys for what the application holds (aiohttp `AppKey`)."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from proxy.alert_rules import Blocked
from proxy.config import Config
from proxy.relay.deferred import Deferred
from proxy.relay.inflight import InFlight
from proxy.relay.load import Load
from proxy.sinks.fanout import Recorder, Sinks

APP_CONFIG = web.AppKey("config", Config)
APP_DEFERRED = web.AppKey("later", Deferred)
APP_DEFERRED_READS = web.AppKey("read_later", Deferred)
"""Where the tees read what the client has: sooner than `APP_DEFERRED`."""
APP_RECORDER = web.AppKey("recorder", Recorder)
"""The database (or memory) recorder, for `/readyz`; it is also the first of `APP_SINKS`."""
APP_SINKS = web.AppKey("sinks", Sinks)
"""Where every finished exchange goes."""
APP_SESSION = web.AppKey("session", aiohttp.ClientSession)
APP_IN_FLIGHT = web.AppKey("in_flight", InFlight)
"""The exchanges being relayed: what SIGTERM waits for, then cuts (`inflight`)."""
APP_BLOCKED = web.AppKey("blocked", Blocked)
"""Spent blocking budgets (`proxy.relay.budgets`), kept by `serve`'s alert evaluation."""
APP_LOAD = web.AppKey("load", Load)
"""The worker's open connections and streams, against its limits (`relay.load`)."""
