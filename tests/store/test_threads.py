"""`threads.keys`: which messages each key hashes (the sessions end to end are in
tests/console/test_sessions.py)."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

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


def reference(messages: list[Any]) -> str:
    """A key as stored since sessions began: the SHA-256 of the messages' JSON array, each
    message as a client sends it back. Keys already in databases must keep matching."""
    normalised = [threads._message(m) for m in messages]
    body = orjson.dumps(normalised, option=orjson.OPT_NON_STR_KEYS)
    return "chat:" + hashlib.sha256(body).hexdigest()[:32]


_texts = st.one_of(
    st.none(),
    st.text(max_size=20),
    st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=5)}
        ),
        max_size=2,
    ),
)
_messages = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": _texts},
        optional={
            "tool_calls": st.lists(
                st.fixed_dictionaries(
                    {
                        "id": st.text(max_size=4),
                        "function": st.fixed_dictionaries(
                            {"name": st.text(max_size=4), "arguments": st.text(max_size=8)}
                        ),
                    }
                ),
                max_size=2,
            ),
            "tool_call_id": st.text(max_size=4),
            "name": st.text(max_size=4),
        },
    ),
    st.integers(),
)


@given(
    messages=st.lists(_messages, min_size=1, max_size=8),
    answer=st.one_of(st.none(), _messages),
)
def test_both_keys_taken_in_one_pass_are_the_keys_hashed_whole(
    messages: list[Any], answer: Any
) -> None:
    response = {"choices": [{"message": answer}]}
    turn, parent = threads.keys({"messages": messages}, response)
    assistants = [
        i for i, m in enumerate(messages) if isinstance(m, dict) and m["role"] == "assistant"
    ]
    assert parent == (reference(messages[: assistants[-1] + 1]) if assistants else None)
    assert turn == (reference([*messages, answer]) if isinstance(answer, dict) else None)
