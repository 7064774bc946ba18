"""`threads.keys`: which messages each key hashes (the sessions end to end are in
tests/console/test_sessions.py)."""

from __future__ import annotations

from typing import Any

from proxy.store import threads


def digest(messages: list[Any]) -> str:
    """The key of `messages`, each read as a client sends it back."""
    return threads._hashed([threads._message(m) for m in messages])


def test_the_parent_key_hashes_the_messages_up_to_the_last_assistant_one() -> None:
    messages: list[Any] = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": [{"type": "text", "text": "three"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {}}]},
        "not a message",
        {"role": "tool", "tool_call_id": "c", "content": "four"},
    ]
    answer = {"role": "assistant", "content": "five"}
    turn, parent = threads.keys({"messages": messages}, {"choices": [{"message": answer}]})
    assert parent == digest(messages[:4])
    assert turn == digest([*messages, answer])
    assert threads.keys({"messages": messages[4:]}, None) == (None, None)
    assert threads.keys({"messages": [messages[0]]}, {"choices": []}) == (None, None)


def test_a_message_is_hashed_as_a_client_sends_it_back() -> None:
    plain: dict[str, Any] = {"role": "assistant", "content": "hi"}
    echoed: dict[str, Any] = {**plain, "refusal": None, "annotations": [], "tool_calls": None}
    parts = {"role": "assistant", "content": [{"type": "text", "text": "h"}, {"text": "i"}]}
    assert threads._message(plain) == threads._message(echoed) == ["assistant", "hi", [], "", ""]
    assert threads._message(parts)[1] == [{"type": "text", "text": "h"}, {"text": "i"}]
    assert threads._message({"role": "user", "content": None})[1] == ""
