"""Typed keys for what the application holds (aiohttp `AppKey`)."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from proxy.config import Config
from proxy.relay.deferred import Later
from proxy.sinks.fanout import Recorder, Sinks

APP_CONFIG = web.AppKey("config", Config)
APP_LATER = web.AppKey("later", Later)
APP_READ_LATER = web.AppKey("read_later", Later)
"""Where the tees read what the client has: sooner than `APP_LATER`."""
APP_RECORDER = web.AppKey("recorder", Recorder)
"""The database (or memory) recorder, for `/readyz`; it is also the first of `APP_SINKS`."""
APP_SINKS = web.AppKey("sinks", Sinks)
"""Where every finished exchange goes."""
APP_SESSION = web.AppKey("session", aiohttp.ClientSession)
