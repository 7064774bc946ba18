"""The WebSocket session readers, frame by frame: Realtime's GA and beta event names, audio
counted and kept only when asked, responses the server starts itself, refused requests, the
Responses API's lanes (`stream_id`) with two responses in flight, and the session's record
bound."""

from __future__ import annotations

import base64
from typing import Any

import orjson

from proxy.stream.realtime import RealtimeReader, audio_size
from proxy.stream.responses_ws import ResponsesWsReader
from proxy.stream.wsresponse import Budget, WsResponse


def frame(**event: Any) -> bytes:
    return orjson.dumps(event)


def realtime(store_audio: bool = False, limit: int = 1 << 20) -> RealtimeReader:
    return RealtimeReader("gpt-realtime", store_audio=store_audio, budget=Budget(limit))


def test_audio_size_reads_base64_padding() -> None:
    for size in range(0, 10):
        assert audio_size(base64.b64encode(bytes(size)).decode()) == size


def test_beta_names_give_the_first_delta_and_the_partial_text() -> None:
    reader = realtime()
    reader.from_client(frame(type="response.create"), 1.0)
    reader.from_server(frame(type="response.created", response={"id": "r1"}), 1.5)
    reader.from_server(
        frame(
            type="response.audio.delta",
            response_id="r1",
            item_id="i1",
            content_index=0,
            delta=base64.b64encode(bytes(480)).decode(),
        ),
        2.0,
    )
    reader.from_server(
        frame(
            type="response.audio_transcript.delta",
            response_id="r1",
            item_id="i1",
            content_index=0,
            delta="Bonjour",
        ),
        2.5,
    )
    reader.from_server(
        frame(
            type="response.text.delta", response_id="r1", item_id="i2", content_index=0, delta="Hi"
        ),
        2.6,
    )
    [left] = reader.end("client_disconnected", "client left mid-response", 3.0)
    assert (left.first_delta_at, left.created_at, left.ended_at) == (2.0, 1.5, 3.0)
    assert left.outcome == "client_disconnected" and left.events == 4
    assert left.response is not None
    assert left.response["output"] == [
        {
            "id": "i1",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_audio", "transcript": "Bonjour"}],
        },
        {
            "id": "i2",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi"}],
        },
    ]


def test_audio_is_kept_only_with_store_audio() -> None:
    chunk = bytes(range(200))
    for keep in (False, True):
        reader = realtime(store_audio=keep)
        reader.from_server(
            frame(
                type="session.created",
                session={
                    "model": "gpt-realtime",
                    "audio": {"input": {"format": {"type": "audio/pcmu"}}},
                },
            ),
            0,
        )
        reader.from_client(
            frame(type="input_audio_buffer.append", audio=base64.b64encode(chunk).decode()), 0.5
        )
        reader.from_client(
            frame(type="input_audio_buffer.append", audio=base64.b64encode(chunk[:7]).decode()), 0.6
        )
        reader.from_server(frame(type="response.created", response={"id": "r1"}), 1)
        reader.from_server(
            frame(
                type="response.output_audio.delta",
                response_id="r1",
                item_id="i1",
                content_index=0,
                delta=base64.b64encode(chunk).decode(),
            ),
            1.1,
        )
        item = {"id": "i1", "type": "message", "content": [{"type": "output_audio"}]}
        [done] = reader.from_server(
            frame(
                type="response.done", response={"id": "r1", "status": "completed", "output": [item]}
            ),
            2,
        )
        assert done.request is not None and done.response is not None
        # Server-started (no response.create): the audio appended before it is its request.
        assert "event" not in done.request
        heard = done.request["input_audio"]
        assert (heard["bytes"], heard["seconds"]) == (207, 0.026)  # G.711: 8,000 bytes/s
        assert done.response["output_audio"]["bytes"] == 200
        part = done.response["output"][0]["content"][0]
        if keep:
            assert base64.b64decode(heard["audio"]) == chunk + chunk[:7]
            assert base64.b64decode(part["audio"]) == chunk
        else:
            assert "audio" not in heard and "audio" not in part


def test_a_refused_response_create_is_a_response_of_its_own() -> None:
    reader = realtime()
    reader.from_client(frame(type="response.create", event_id="evt_9"), 1.0)
    [refused] = reader.from_server(
        frame(
            type="error",
            error={
                "type": "invalid_request_error",
                "code": "conversation_already_has_active_response",
                "message": "Conversation already has an active response",
                "event_id": "evt_9",
            },
        ),
        1.2,
    )
    assert refused.outcome == "upstream_error"
    assert refused.error == "Conversation already has an active response"
    assert refused.request is not None and refused.request["event"]["event_id"] == "evt_9"


def test_out_of_band_responses_are_kept_apart_by_response_id() -> None:
    reader = realtime()
    reader.from_client(frame(type="response.create", response={"conversation": "none"}), 1)
    reader.from_client(frame(type="response.create"), 2)
    reader.from_server(frame(type="response.created", response={"id": "a"}), 3)
    reader.from_server(frame(type="response.created", response={"id": "b"}), 4)
    for rid, text in (("b", "B1"), ("a", "A1"), ("b", "B2")):
        reader.from_server(
            frame(
                type="response.output_text.delta",
                response_id=rid,
                item_id=f"i{rid}",
                content_index=0,
                delta=text,
            ),
            5,
        )
    [b] = reader.from_server(
        frame(
            type="response.done",
            response={"id": "b", "usage": {"input_tokens": 3, "output_tokens": 2}},
        ),
        6,
    )
    [a] = reader.end("upstream_disconnected", "upstream left mid-response", 7)
    assert b.request is not None and b.request["event"] == {"type": "response.create"}
    assert b.usage == {"input_tokens": 3, "output_tokens": 2} and b.events == 4
    assert a.response is not None and a.response["output"][0]["content"][0]["text"] == "A1"


def responses_event(kind: str, lane: str | None, **fields: Any) -> bytes:
    event = {"type": kind, **fields}
    if lane is not None:
        event["stream_id"] = lane
    return orjson.dumps(event)


def test_two_lanes_in_flight_are_two_responses() -> None:
    reader = ResponsesWsReader(budget=Budget(1 << 20))
    for lane, text in (("a", "first"), ("b", "second")):
        reader.from_client(
            frame(type="response.create", stream_id=lane, model="gpt-4.1", input=text), 0
        )
    finished: list[WsResponse] = []
    for lane, rid in (("a", "ra"), ("b", "rb")):
        created = {"id": rid, "object": "response", "status": "in_progress", "output": []}
        finished += reader.from_server(
            responses_event("response.created", lane, response=created), 1
        )
    for lane, delta in (("b", "B"), ("a", "A"), ("b", "b")):
        finished += reader.from_server(
            responses_event(
                "response.output_text.delta",
                lane,
                item_id="m",
                output_index=0,
                content_index=0,
                delta=delta,
            ),
            2,
        )
    usage = {"input_tokens": 4, "output_tokens": 2, "total_tokens": 6}
    final = {
        "id": "rb",
        "object": "response",
        "status": "completed",
        "usage": usage,
        "model": "gpt-4.1-2025-04-14",
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "Bb"}]}],
    }
    finished += reader.from_server(responses_event("response.completed", "b", response=final), 3)
    [rb] = finished
    assert rb.request == {"model": "gpt-4.1", "input": "second", "stream": True}
    assert rb.usage == usage and rb.response_id == "rb"
    assert rb.response is not None and rb.response["output"][0]["content"][0]["text"] == "Bb"
    [ra] = reader.end("client_disconnected", "client left mid-response", 4)
    assert ra.request is not None and ra.request["input"] == "first"
    assert ra.response is not None and ra.response["output"][0]["content"][0]["text"] == "A"


def test_an_error_before_any_response_refuses_the_request_on_its_lane() -> None:
    reader = ResponsesWsReader(budget=Budget(1 << 20))
    reader.from_client(
        frame(type="response.create", model="gpt-4.1", input="x", previous_response_id="resp_gone"),
        0,
    )
    error = {
        "type": "invalid_request_error",
        "code": "previous_response_not_found",
        "message": "Previous response with id 'resp_gone' not found.",
        "param": None,
    }
    [refused] = reader.from_server(frame(type="error", error=error, status=400), 1)
    assert (refused.outcome, refused.status) == ("upstream_error", 400)
    assert refused.error == "Previous response with id 'resp_gone' not found."
    assert refused.request is not None and refused.request["previous_response_id"] == "resp_gone"


def test_past_the_session_bound_bodies_go_but_usage_stays() -> None:
    reader = ResponsesWsReader(budget=Budget(300))
    usage = {"input_tokens": 4, "output_tokens": 2, "total_tokens": 6}
    outs: list[WsResponse] = []
    for turn in range(3):
        reader.from_client(frame(type="response.create", model="m", input="y" * 60), 0)
        created = {"id": f"r{turn}", "object": "response", "status": "in_progress"}
        reader.from_server(frame(type="response.created", response=created), 1)
        reader.from_server(
            frame(
                type="response.output_text.delta",
                item_id="m",
                output_index=0,
                content_index=0,
                delta="z" * 40,
            ),
            2,
        )
        done = {**created, "status": "completed", "usage": usage, "output": [{"type": "x"}]}
        outs += reader.from_server(frame(type="response.completed", response=done), 3)
    assert [out.cut for out in outs] == [False, True, True]
    assert outs[0].request is not None and outs[1].request is None
    assert outs[2].response == {
        "id": "r2",
        "object": "response",
        "status": "completed",
        "usage": usage,
    }
    assert all(out.usage == usage for out in outs)
    assert outs[2].notes == ["session record cut at max_session_record_bytes (300)"]


def test_a_realtime_session_past_its_bound_keeps_usage_not_bodies() -> None:
    reader = realtime(limit=400)
    usage = {"input_tokens": 5, "output_tokens": 3}
    outs: list[WsResponse] = []
    for turn in range(3):
        reader.from_client(frame(type="conversation.item.create", item={"text": "x" * 100}), 0)
        reader.from_client(frame(type="response.create"), 1)
        reader.from_server(frame(type="response.created", response={"id": f"r{turn}"}), 2)
        reader.from_server(
            frame(
                type="response.output_text.delta",
                response_id=f"r{turn}",
                item_id="i",
                content_index=0,
                delta="y" * 50,
            ),
            3,
        )
        done = {"id": f"r{turn}", "status": "completed", "usage": usage, "output": [{"id": "i"}]}
        outs += reader.from_server(frame(type="response.done", response=done), 4)
    assert [out.cut for out in outs] == [False, True, True]
    assert outs[0].request is not None and outs[0].response is not None
    assert outs[0].response["output"] == [{"id": "i"}]
    assert outs[2].request is None
    assert outs[2].response == {"id": "r2", "status": "completed", "usage": usage}
    assert all(out.usage == usage for out in outs)
    assert outs[2].notes == ["session record cut at max_session_record_bytes (400)"]
