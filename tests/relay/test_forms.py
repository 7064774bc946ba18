"""Form fields of a multipart body, as aiohttp's own encoder writes the form; any bytes at all
give fields or none, never an error."""

from __future__ import annotations

import aiohttp
from aiohttp import payload
from hypothesis import given
from hypothesis import strategies as st

from proxy.relay.forms import MAX_FIELD_BYTES, form_fields

NAMES = ("model", "stream", "user")


async def encoded(form: aiohttp.FormData) -> tuple[str, bytes]:
    """(Content-Type, body) of a form, as aiohttp sends it."""
    body = form()
    assert isinstance(body, payload.Payload)

    class Sink:
        def __init__(self) -> None:
            self.data = bytearray()

        async def write(self, chunk: bytes) -> None:
            self.data += chunk

    sink = Sink()
    await body.write(sink)  # type: ignore[arg-type]
    return str(body.content_type), bytes(sink.data)


async def test_text_fields_are_read_and_files_are_skipped() -> None:
    form = aiohttp.FormData()
    form.add_field("file", b"model\r\n--x\r\n\xff" * 100, filename="model.wav")
    form.add_field("model", "gpt-4o-mini-transcribe")
    form.add_field("prompt", "line one\r\nline two")
    form.add_field("stream", "true")
    content_type, body = await encoded(form)
    assert form_fields(body, content_type, NAMES) == {
        "model": "gpt-4o-mini-transcribe",
        "stream": "true",
    }
    assert form_fields(body, content_type, ("prompt",)) == {"prompt": "line one\r\nline two"}
    assert form_fields(body, "application/json", NAMES) == {}


def test_a_quoted_boundary_and_a_body_cut_short() -> None:
    content_type = 'Multipart/Form-Data; charset=utf-8; boundary="a b:c"'
    body = b'--a b:c\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n--a b:c--'
    assert form_fields(body, content_type, NAMES) == {"model": "whisper-1"}
    cut = body[: body.index(b"whisper") + 4]
    assert form_fields(cut, content_type, NAMES) == {"model": "whis"}
    assert form_fields(body[: body.index(b"\r\n\r\n")], content_type, NAMES) == {}


def test_long_or_undecodable_values_are_not_fields() -> None:
    def body(value: bytes) -> bytes:
        return (
            b'--bx\r\nContent-Disposition: form-data; name="model"\r\n\r\n' + value + b"\r\n--bx--"
        )

    content_type = "multipart/form-data; boundary=bx"
    assert form_fields(body(b"m" * MAX_FIELD_BYTES), content_type, NAMES) == {
        "model": "m" * MAX_FIELD_BYTES
    }
    assert form_fields(body(b"m" * (MAX_FIELD_BYTES + 1)), content_type, NAMES) == {}
    assert form_fields(body(b"\xff\xfe"), content_type, NAMES) == {}


VALID = (
    b"preamble\r\n--bx\r\nContent-Disposition: form-data; name=model\r\n\r\nm1\r\n"
    b'--bx\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n\x00\r\n'
    b'--bx\r\ncontent-disposition: form-data; name="stream"\r\n\r\ntrue\r\n--bx--\r\n'
)


def test_an_unquoted_name_a_preamble_and_lower_case_headers() -> None:
    assert form_fields(VALID, "multipart/form-data; boundary=bx", NAMES) == {
        "model": "m1",
        "stream": "true",
    }


@given(st.integers(0, len(VALID)), st.integers(0, len(VALID)), st.binary(max_size=8))
def test_any_bytes_give_fields_or_none(cut: int, at: int, noise: bytes) -> None:
    body = (VALID[:at] + noise + VALID[at:])[:cut]
    fields = form_fields(body, "multipart/form-data; boundary=bx", NAMES)
    assert set(fields) <= set(NAMES) and all(len(v) <= MAX_FIELD_BYTES for v in fields.values())
