"""Paths and queries as the proxy routes and records them (`proxy/relay/paths.py`)."""

from __future__ import annotations

import pytest

from proxy.relay.paths import mask_query, normalise


@pytest.mark.parametrize(
    ("path", "clean"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/models/gpt-4.1", "/v1/models/gpt-4.1"),
        ("/v1/files/file%2ejsonl", "/v1/files/file%2ejsonl"),  # a dot in a name, as sent
        ("/v1/models/meta%2Fllama", "/v1/models/meta%2Fllama"),  # an encoded slash, as sent
        ("/v1/./models", "/v1/models"),
        ("/v1/a/b/../../models", "/v1/models"),
        ("/v1/%2E/models/%2e%2E/files", "/v1/files"),
        ("/v1/models/.", "/v1/models/"),
        ("/v1/models/..", "/v1/"),
        ("/v1/...", "/v1/..."),
        ("/..", None),
        ("/v1/../../x", None),
        ("/v1/..%2Fx", None),
        ("/v1/%2e%2e%5cx", None),
        ("/v1/a\\..\\x", None),
        ("/v1/..;jsessionid=1/x", None),
    ],
)
def test_dot_segments_are_resolved_or_refused(path: str, clean: str | None) -> None:
    assert normalise(path) == clean


@pytest.mark.parametrize(
    ("query", "stored"),
    [
        ("", ""),
        ("limit=2&after=a b", "limit=2&after=a b"),
        ("key=AIza123", "key=***"),
        ("api-version=2024-06-01&api-key=abc", "api-version=2024-06-01&api-key=***"),
        ("API_KEY=abc&Token=def&x=1", "API_KEY=***&Token=***&x=1"),
        ("access_token=a%26b%3Dc&sig=s", "access_token=***&sig=***"),  # & inside stays inside
        ("keys=1&keyword=2&key", "keys=1&keyword=2&key"),  # other names; a name without value
    ],
)
def test_secret_query_values_are_masked(query: str, stored: str) -> None:
    assert mask_query(query) == stored


@pytest.mark.parametrize(
    "name",
    [
        "auth_token",
        "session_token",
        "sessionToken",
        "accessToken",
        "X-Goog-Api-Key",
        "subscription-key",
        "Ocp-Apim-Subscription-Key",
        "private_key",
        "credential",
        "X-Amz-Credential",
        "X-Amz-Security-Token",
        "jwt",
        "bearer",
        "pwd",
        "client.secret",
        "passphrase",
    ],
)
def test_every_spelling_of_a_secret_name_is_masked(name: str) -> None:
    assert mask_query(f"model=m&{name}=s3cr3t") == f"model=m&{name}=***"


@pytest.mark.parametrize("name", ["model", "limit", "after", "order", "api-version", "max_tokens"])
def test_ordinary_names_are_kept(name: str) -> None:
    assert mask_query(f"{name}=v1") == f"{name}=v1"
