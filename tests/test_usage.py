"""The one usage decoder: every endpoint's shape, as the openai SDK's own types serialise it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types import CompletionUsage
from openai.types.audio.transcription import UsageTokens
from openai.types.create_embedding_response import Usage as EmbeddingUsage
from openai.types.images_response import Usage as ImageUsage
from openai.types.realtime.realtime_response_usage import RealtimeResponseUsage
from openai.types.responses import ResponseUsage

from proxy.usage import Usage, decode_usage


def as_sent(model: Any) -> dict[str, Any]:
    """What the API sends: the SDK's pydantic object as JSON."""
    return model.model_dump(mode="json", exclude_none=True)  # type: ignore[no-any-return]


def test_chat_completions_with_every_detail() -> None:
    usage = CompletionUsage.model_validate(
        {
            "prompt_tokens": 100,
            "completion_tokens": 50,
            "total_tokens": 150,
            "prompt_tokens_details": {"cached_tokens": 30, "audio_tokens": 20},
            "completion_tokens_details": {
                "reasoning_tokens": 10,
                "audio_tokens": 5,
                "accepted_prediction_tokens": 2,
                "rejected_prediction_tokens": 3,
            },
        }
    )
    assert decode_usage(as_sent(usage)) == Usage(
        input=100, cached=30, cache_write=0, input_audio=20, cached_audio=0, input_image=0,
        cached_image=0, output=50, reasoning=10, output_audio=5, output_image=0, total=150,
        accepted_prediction=2, rejected_prediction=3,
    )  # fmt: skip


def test_embeddings_have_input_only() -> None:
    found = decode_usage(as_sent(EmbeddingUsage(prompt_tokens=5, total_tokens=5)))
    assert found == Usage(5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, total=5)


def test_responses_api() -> None:
    usage = ResponseUsage.model_validate(
        dict(
            input_tokens=2000,
            input_tokens_details={"cached_tokens": 1500, "cache_write_tokens": 400},
            output_tokens=900,
            output_tokens_details={"reasoning_tokens": 700},
            total_tokens=2900,
        )
    )
    found = decode_usage(as_sent(usage))
    assert found == Usage(2000, 1500, 400, 0, 0, 0, 0, 900, 700, 0, 0, 2900)


def test_realtime_splits_cached_tokens_by_modality() -> None:
    usage = RealtimeResponseUsage.model_validate(
        dict(
            input_tokens=1000,
            input_token_details={
                "text_tokens": 300,
                "audio_tokens": 600,
                "image_tokens": 100,
                "cached_tokens": 250,
                "cached_tokens_details": {
                    "text_tokens": 50,
                    "audio_tokens": 150,
                    "image_tokens": 50,
                },
            },
            output_tokens=400,
            output_token_details={"text_tokens": 100, "audio_tokens": 300},
            total_tokens=1400,
        )
    )
    assert decode_usage(as_sent(usage)) == Usage(
        input=1000, cached=250, cache_write=0, input_audio=600, cached_audio=150, input_image=100,
        cached_image=50, output=400, reasoning=0, output_audio=300, output_image=0, total=1400,
    )  # fmt: skip


def test_image_generation_and_transcription_tokens() -> None:
    image = ImageUsage.model_validate(
        dict(
            input_tokens=50,
            input_tokens_details={"text_tokens": 10, "image_tokens": 40},
            output_tokens=4160,
            output_tokens_details={"text_tokens": 0, "image_tokens": 4160},
            total_tokens=4210,
        )
    )
    assert decode_usage(as_sent(image)) == Usage(50, 0, 0, 0, 0, 40, 0, 4160, 0, 0, 4160, 4210)
    heard = UsageTokens.model_validate(
        dict(
            type="tokens",
            input_tokens=120,
            input_token_details={"text_tokens": 20, "audio_tokens": 100},
            output_tokens=30,
            total_tokens=150,
        )
    )
    assert decode_usage(as_sent(heard)) == Usage(120, 0, 0, 100, 0, 0, 0, 30, 0, 0, 0, 150)


@pytest.mark.parametrize(
    "usage",
    [None, [], "12", {}, {"type": "duration", "seconds": 12}, {"prompt_tokens": -1}],
)
def test_no_usage_or_an_unknown_shape_is_none(usage: Any) -> None:
    assert decode_usage(usage) is None


def test_details_are_cut_to_their_totals() -> None:
    usage = {
        "input_tokens": 10,
        "input_token_details": {
            "cached_tokens": 50,
            "audio_tokens": 8,
            "cached_tokens_details": {"audio_tokens": 9},
        },
        "output_tokens": 4,
        "output_token_details": {"audio_tokens": 7},
    }
    assert decode_usage(usage) == Usage(10, 10, 0, 8, 8, 0, 0, 4, 0, 4, 0)


@pytest.mark.parametrize(
    ("sent", "read"),
    [(7, 7), (0, 0), (3.0, 3), (-1, None), (True, None), (2.5, None), ("7", None), (None, None)],
)
def test_each_count_as_sent_or_none(sent: Any, read: int | None) -> None:
    """Every top-level count and prediction count takes a whole non-negative number (a float
    one too), and nothing else; a total that is none is no usage, an output none is 0."""
    counts = ("total_tokens", "accepted_prediction_tokens", "rejected_prediction_tokens")
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": sent,
        "total_tokens": sent,
        "completion_tokens_details": {
            "accepted_prediction_tokens": sent,
            "rejected_prediction_tokens": sent,
        },
    }
    decoded = decode_usage(usage)
    assert decoded is not None
    assert decoded.output == (read or 0)
    assert [getattr(decoded, c.removesuffix("_tokens")) for c in counts] == [read] * 3
    found = decode_usage({"prompt_tokens": sent, "completion_tokens": 1})
    assert (found.input if found is not None else None) == read


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
_keys = st.sampled_from(
    ["prompt_tokens", "completion_tokens", "input_tokens", "output_tokens",
     "prompt_tokens_details", "completion_tokens_details", "input_tokens_details",
     "input_token_details", "output_token_details", "cached_tokens", "cached_tokens_details",
     "audio_tokens", "image_tokens", "reasoning_tokens", "cache_write_tokens"]
)  # fmt: skip


@given(st.dictionaries(_keys, _json | st.dictionaries(_keys, _json, max_size=4), max_size=6))
def test_never_raises_and_every_part_is_within_its_whole(usage: dict[str, Any]) -> None:
    found = decode_usage(usage)
    if found is not None:
        assert 0 <= found.cached <= found.input and 0 <= found.input_audio <= found.input
        assert 0 <= found.cached_audio <= min(found.cached, found.input_audio)
        assert 0 <= found.cached_image <= min(found.cached, found.input_image)
        assert 0 <= found.cache_write <= found.input - found.cached
        assert 0 <= found.reasoning <= found.output and 0 <= found.output_audio <= found.output
