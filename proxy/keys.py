"""Typed keys for what the application holds (aiohttp `AppKey`)."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from .config import Config
from .later import Later
from .recorder import Recorder
from .sinks import Sink

APP_CONFIG = web.AppKey("config", Config)
APP_LATER = web.AppKey("later", Later)
APP_READ_LATER = web.AppKey("read_later", Later)
"""Where the tees read what the client has: sooner than `APP_LATER`."""
APP_RECORDER = web.AppKey("recorder", Recorder)
APP_SESSION = web.AppKey("session", aiohttp.ClientSession)
APP_SINKS = web.AppKey[tuple[Sink, ...]]("sinks")
