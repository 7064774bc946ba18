"""What an exchange cost, and where the price came from.

Prices come from pydantic's genai-prices package (its data snapshot, pinned by the package
version): the provider is the upstream's `provider` setting, else the one whose API URL
pattern matches the upstream's `base_url`, else the one genai-prices picks by the model
name. The model is the one that answered, else the one requested. The price is the one in
force on the exchange's start date, for the `service_tier` the response reports (`flex`,
`priority`, ...) and batch processing, and the long-context tier the prompt's length
reaches. Config `[prices."<model>"]` entries win over genai-prices for the models they name.

A lookup goes through genai-prices once per (upstream, model) and once per (price, tier,
day); the result is compiled (`proxy.rates`) and kept, so pricing an exchange is a couple of
dictionary reads and a few integer products. Data fetched in the background
(`PriceUpdates`) replaces the snapshot; the kept lookups start over when it does.

Every priced exchange says where its price came from (`Priced.source`), e.g.
`genai-prices 0.2.3 openai/gpt-5.5 flex` or `config gpt-foo`. An unknown model, or usage
with no shape we know, gets no price at all (None), never a silent 0.

Pure but for `PriceUpdates`, which makes outbound calls only when started.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, NamedTuple, Protocol

import genai_prices
from genai_prices import UpdatePrices, data_snapshot
from genai_prices.types import ModelInfo, Provider, TimeOfDateConstraint
from genai_prices.update_prices import DEFAULT_UPDATE_URL as _DEFAULT_UPDATE_URL

from proxy.rates import Rates, compile_rates, model_price_fields
from proxy.usage import Usage

SOURCE = f"genai-prices {genai_prices.__version__}"
UPDATE_URL: str = _DEFAULT_UPDATE_URL
"""Where `price_update` fetches genai-prices' data by default: the file the package publishes."""
CONFIG_FIELDS = {
    "input": "input_mtok",
    "cached_input": "cache_read_mtok",
    "cache_write": "cache_write_mtok",
    "output": "output_mtok",
    "audio_input": "input_audio_mtok",
    "audio_output": "output_audio_mtok",
}
"""`[prices."<model>"]` fields (USD per 1M tokens) and the genai-prices price each sets."""
NO_PROVIDER = "none"
"""An upstream's `provider` that turns genai-prices off for it (config entries still apply)."""
# What may follow a config key in a model name for the key to price it: OpenAI dates its
# snapshots with "-", other servers tag models with ":" (llama3:8b) or "@" (model@2024-05-13).
_BOUNDARY = ("-", ":", "@")
_KEPT = 4096
"""Distinct lookups remembered before starting over: model names come from clients."""
_DAY = 86_400
_new_tuple = tuple.__new__
"""Makes a `Priced` from both its values without the Python call its `__new__` is."""


class Priced(NamedTuple):
    """One exchange's price."""

    cost_usd: float
    """The float nearest the exact amount."""
    source: str
    """Where the price came from: `genai-prices <version> <provider>/<model> <variant>`
    (with `>N` when a long-context rate for prompts over N tokens applied), or
    `config <key>`."""


class _Match(NamedTuple):
    provider: Provider
    model: ModelInfo
    name: str
    """`provider/model`, as genai-prices names them."""
    timed: bool
    """Some price of it holds only at certain times of day: rates are kept per minute."""


class _Compiled(NamedTuple):
    rates: Rates
    source: str


def _rate(where: str, value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: expected a price in USD per 1M tokens, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: expected a non-negative price, got {value!r}")
    # repr is the shortest text that reads back as the same float: the price as written.
    return Decimal(repr(value))


def config_rates(model: str, fields: Any) -> Rates:
    """The rates of one `[prices."<model>"]` table; ValueError naming the field otherwise.

    `input` and `output` are required; cached tokens cost `input` and audio tokens their
    text rate unless the table gives their own rates."""
    where = f"prices.{model}"
    if not isinstance(fields, Mapping):
        raise ValueError(f"{where}: expected a table of prices, got {fields!r}")
    known = sorted([*CONFIG_FIELDS, "note"])
    for name in fields:
        if name not in known:
            raise ValueError(f"{where}.{name}: unknown field (known: {', '.join(known)})")
    prices = {
        key: _rate(f"{where}.{name}", fields[name])
        for name, key in CONFIG_FIELDS.items()
        if name in fields
    }
    for name in ("input", "output"):
        if name not in fields:
            raise ValueError(f"{where}.{name}: required (USD per 1M tokens)")
    return compile_rates(prices)


class _Upstream(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def provider(self) -> str | None: ...


def upstream_providers(upstreams: Iterable[_Upstream]) -> dict[str, str]:
    """Upstream name to its `provider` setting, for the upstreams that have one."""
    return {u.name: u.provider for u in upstreams if u.provider}


def warm() -> None:
    """Load genai-prices' data now (a large module) rather than on the first exchange."""
    data_snapshot.get_snapshot()


def provider_names() -> list[str]:
    """Every provider id genai-prices knows (what an upstream's `provider` may say)."""
    return sorted(p.id for p in data_snapshot.get_snapshot().providers)


def _timed(model: ModelInfo) -> bool:
    prices = model.prices if isinstance(model.prices, list) else []
    constraints = [p.constraint for p in prices] + [
        v.constraint for v in model.price_variants or ()
    ]
    return any(isinstance(c, TimeOfDateConstraint) for c in constraints)


def _variant(model: ModelInfo, at: datetime, context: Mapping[str, str]) -> str:
    """The names of the variants that changed a price, e.g. "flex"; "standard" if none."""
    applied = [
        value
        for v in model.price_variants or ()
        if v.when.items() <= context.items()
        and (v.constraint is None or v.constraint.active(at))
        and any(p is not None for p in model_price_fields(v.prices).values())
        for value in v.when.values()
    ]
    return " ".join(dict.fromkeys(applied)) or "standard"


class Prices:
    """genai-prices' data and config entries, with the lookups made so far."""

    __slots__ = ("_config", "_found", "_lengths", "_live", "_providers", "_rates", "_snapshot")

    def __init__(
        self,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
        providers: Mapping[str, str] | None = None,
        *,
        live: bool = False,
    ) -> None:
        """`overrides`: `[prices."<model>"]` tables; `providers`: upstream name to the
        provider its `provider` setting names; `live`: the data may be replaced while it runs
        (`PriceUpdates`), so look for that on every exchange. ValueError for a bad table or
        provider."""
        self._config: dict[str, Rates] = {}
        for model, fields in (overrides or {}).items():
            if not isinstance(model, str) or not model:
                raise ValueError(f"prices: expected model names, got {model!r}")
            self._config[model] = config_rates(model, fields)
        self._lengths = sorted({len(key) for key in self._config}, reverse=True)
        known = {*provider_names(), NO_PROVIDER} if providers else set()
        for upstream, provider in (providers or {}).items():
            if provider not in known:
                raise ValueError(
                    f"upstreams.{upstream}.provider: unknown provider {provider!r} "
                    f"(known: {', '.join(sorted(known))})"
                )
        self._providers = dict(providers or {})
        self._live = live
        self._snapshot = data_snapshot.get_snapshot() if live else None
        self._found: dict[tuple[str, str], _Match | Rates | None] = {}
        self._rates: dict[tuple[Any, ...], _Compiled | None] = {}

    def price(
        self,
        usage: Usage | None,
        model: str | None,
        *,
        upstream: str = "",
        base_url: str = "",
        service_tier: str | None = None,
        started_at: float | None = None,
        batch: bool = False,
    ) -> Priced | None:
        """The price of one exchange; None for an unknown model or no usage.

        `model`: the answering model, else the requested one; `upstream`, `base_url`: the
        upstream's name and URL (which provider's prices apply); `service_tier`: as the
        response reports it; `started_at`: epoch seconds (which dated price applies);
        `batch`: a Batch API result."""
        if usage is None or not model or type(model) is not str:
            return None
        if self._live and data_snapshot.get_snapshot() is not self._snapshot:
            self._snapshot = data_snapshot.get_snapshot()
            self._found.clear()
            self._rates.clear()
        # An upstream's name stands for its URL: its paths need no lookup each.
        key = (upstream or base_url, model)
        try:
            found = self._found[key]
        except KeyError:
            if len(self._found) >= _KEPT:
                self._found.clear()
            found = self._found[key] = self._search(upstream, base_url, model)
        if found is None:
            return None
        if type(found) is Rates:
            cost = found.cost(usage)
            return None if cost is None else Priced(cost, f"config {self._config_key(model)}")
        assert type(found) is _Match
        at = started_at if started_at is not None else datetime.now(UTC).timestamp()
        slot = int(at // 60) if found.timed else int(at // _DAY)
        ready = (found.name, service_tier, batch, slot)
        try:
            compiled = self._rates[ready]
        except KeyError:
            if len(self._rates) >= _KEPT:
                self._rates.clear()
            compiled = self._rates[ready] = _compile(found, at, service_tier, batch)
        if compiled is None:
            return None
        rates = compiled.rates
        cost = rates.cost(usage)
        if cost is None:
            return None
        if len(rates.bands) == 1:
            return _new_tuple(Priced, (cost, compiled.source))
        return _new_tuple(Priced, (cost, _long(compiled, usage)))

    def _search(self, upstream: str, base_url: str, model: str) -> _Match | Rates | None:
        if (key := self._config_key(model)) is not None:
            return self._config[key]
        provider = self._providers.get(upstream)
        if provider == NO_PROVIDER:
            return None
        snapshot = data_snapshot.get_snapshot()
        try:
            if provider is None:
                found = _guess(snapshot, base_url, model)
            else:
                found = snapshot.find_provider_model(model, None, provider, None)
        except LookupError:
            return None
        provider_found, model_found = found
        name = f"{provider_found.id}/{model_found.id}"
        return _Match(provider_found, model_found, name, _timed(model_found))

    def _config_key(self, model: str) -> str | None:
        """The config entry for `model`: exact, else the longest key it continues."""
        if model in self._config:
            return model
        for length in self._lengths:
            # A key that itself ends in a separator ("ft:") matches whatever follows it.
            if (
                length < len(model)
                and (model[length] in _BOUNDARY or model[length - 1] in _BOUNDARY)
                and model[:length] in self._config
            ):
                return model[:length]
        return None


def _guess(snapshot: Any, base_url: str, model: str) -> tuple[Provider, ModelInfo]:
    """The provider whose URL pattern matches the upstream's; for a URL no provider claims
    (a gateway, a local server), genai-prices' guess from the model name, else OpenAI's
    prices: flightrec fronts OpenAI-compatible APIs. LookupError when none knows the model."""
    try:
        provider = snapshot.find_provider(None, None, base_url) if base_url else None
    except LookupError:
        provider = None
    if provider is not None:
        return snapshot.find_provider_model(model, provider, None, None)  # type: ignore[no-any-return]
    try:
        return snapshot.find_provider_model(model, None, None, None)  # type: ignore[no-any-return]
    except LookupError:
        return snapshot.find_provider_model(model, None, "openai", None)  # type: ignore[no-any-return]


def _compile(found: _Match, at: float, service_tier: str | None, batch: bool) -> _Compiled | None:
    when = datetime.fromtimestamp(at, UTC)
    context: dict[str, str] = {}
    if isinstance(service_tier, str) and service_tier:
        context["service_tier"] = service_tier
    if batch:
        context["processing"] = "batch"
    model = found.model
    # A model found through another provider's fallback list has that provider's variants.
    own = any(model is m for m in found.provider.models)
    resolved = model.get_prices(when, context if own else None)
    variant = _variant(model, when, context) if own else "standard"
    source = f"{_version()} {found.name} {variant}"
    try:
        return _Compiled(compile_rates(model_price_fields(resolved)), source)
    except (ValueError, KeyError):  # a price genai-prices itself would refuse
        return None


def _long(compiled: _Compiled, usage: Usage) -> str:
    """The source, saying which long-context threshold the prompt passed, if any."""
    for band in compiled.rates.bands:
        if usage.input > band.above >= 0:
            return f"{compiled.source} >{band.above}"
    return compiled.source


def _version() -> str:
    """genai-prices' version, and when its data came from a background fetch, that time."""
    snapshot = data_snapshot.get_snapshot()
    if snapshot.from_auto_update:
        return f"{SOURCE} data {snapshot.timestamp.astimezone(UTC):%Y-%m-%dT%H:%MZ}"
    return SOURCE


class PriceUpdates:
    """`price_update = true`: genai-prices' own background refresh of its data, in a thread
    it runs, every `interval` seconds from `url`. Nothing is fetched unless started."""

    def __init__(self, url: str = UPDATE_URL, interval: float = 3600) -> None:
        self._updater = UpdatePrices(update_interval=interval, url=url)

    def start(self) -> None:
        self._updater.start()

    def stop(self) -> None:
        self._updater.stop()  # type: ignore[no-untyped-call]  # genai-prices leaves it untyped

    def wait(self, timeout: float) -> bool:
        """Whether fresh data arrived within `timeout` seconds (raises the fetch's error)."""
        return self._updater.wait(timeout)
