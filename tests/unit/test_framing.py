"""The sans-IO frame decoder: any chunking, strict JSON, limits checked on the header."""
from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wire.errors import BadFrameError, FrameTooLargeError, ProtocolError
from wire.framing import (
    MAX_CONTAINERS,
    MAX_NESTING,
    FrameDecoder,
    decode_body,
    encode_frame,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
messages = st.dictionaries(st.text(max_size=8), json_values, max_size=5)


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def decode_all(data: bytes, cuts: list[int], max_frame: int = 1 << 20) -> list[dict]:
    decoder = FrameDecoder(max_frame)
    out = []
    start = 0
    for cut in sorted(set(cuts)) + [len(data)]:
        decoder.feed(data[start:cut])
        start = cut
        out.extend(decoder.messages())
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(messages, min_size=1, max_size=5), st.data())
def test_any_message_survives_any_chunking(batch: list[dict], data: st.DataObject) -> None:
    stream = b"".join(encode_frame(m) for m in batch)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    assert decode_all(stream, cuts) == batch


def test_one_byte_at_a_time_gives_the_same_messages() -> None:
    batch = [{"op": "ping", "id": i, "args": {"text": "é✓😀"}} for i in range(3)]
    stream = b"".join(encode_frame(m) for m in batch)
    assert decode_all(stream, list(range(len(stream)))) == batch


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_raises_only_protocol_errors(garbage: bytes) -> None:
    decoder = FrameDecoder(max_frame=100)
    decoder.feed(garbage)
    try:
        decoder.messages()
    except ProtocolError as exc:
        assert exc.code in ("BAD_FRAME", "FRAME_TOO_LARGE")


def test_length_over_the_limit_is_refused_from_the_header_alone() -> None:
    decoder = FrameDecoder(max_frame=1000)
    decoder.feed(struct.pack(">I", 1001))
    with pytest.raises(FrameTooLargeError):
        decoder.next_message()


def test_a_4_gib_length_allocates_nothing_and_is_refused() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"\xff\xff\xff\xff")
    with pytest.raises(FrameTooLargeError):
        decoder.next_message()


def test_zero_length_is_a_bad_frame() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"\x00\x00\x00\x00")
    with pytest.raises(BadFrameError):
        decoder.next_message()


def test_a_partial_frame_is_reported_as_in_frame() -> None:
    decoder = FrameDecoder()
    assert not decoder.in_frame
    decoder.feed(encode_frame({"op": "ping"})[:6])
    assert decoder.next_message() is None
    assert decoder.in_frame


@pytest.mark.parametrize("body", [
    b'{"a": NaN}', b'{"a": Infinity}', b'{"a": -Infinity}',
    b'{"a": 1, "a": 2}', b'{"a": {"b": 1, "b": 1}}',
    b'{"a": "\\ud800"}', b'{"\\udc00": 1}', b'{"a": ["x", "\\udfff"]}',
    b"[1, 2]", b'"text"', b"42", b"null",
    b"\xff\xfe{}", b'{"a": "\xed\xa0\x80"}', b"{", b"",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"n": ' + b"9" * 5000 + b"}",
])
def test_strict_json_rejects(body: bytes) -> None:
    with pytest.raises(BadFrameError):
        decode_body(body)


def test_surrogate_pairs_are_fine() -> None:
    assert decode_body(b'{"a": "\\ud83d\\ude00"}') == {"a": "😀"}


def test_a_lone_surrogate_is_found_at_any_depth() -> None:
    """Within the nesting limit it is named; past it the frame is refused all the same (Python
    3.12's parser accepts nesting deeper than the recursion limit: a recursive check raised
    RecursionError there, which stopped the whole server)."""
    def nested(depth: int, text: str) -> bytes:
        return ('{"args": ' + "[" * depth + f'"{text}"' + "]" * depth + "}").encode()

    with pytest.raises(BadFrameError, match="lone surrogate"):
        decode_body(nested(MAX_NESTING - 1, "\\ud800"))
    with pytest.raises(BadFrameError):
        decode_body(nested(50_000, "\\ud800"))
    assert decode_body(nested(MAX_NESTING - 1, "\\ud83d\\ude00"))["args"]  # a valid pair passes


@pytest.mark.parametrize("lists", [MAX_NESTING - 1, MAX_NESTING, 900, 1200, 3000, 20_000])
@pytest.mark.parametrize("text", ["\\ud83d\\ude00", "plain"])
def test_nesting_past_the_limit_is_a_bad_frame_on_every_python(lists: int, text: str) -> None:
    """The frame's object and `lists` arrays inside it: at most MAX_NESTING levels decode,
    deeper ones are BAD_FRAME, whatever depth this interpreter's own parser reaches."""
    body = ('{"op": "ping", "x": ' + "[" * lists + f'"{text}"' + "]" * lists + "}").encode()
    if lists + 1 <= MAX_NESTING:
        assert decode_body(body)["op"] == "ping"
    else:
        with pytest.raises(BadFrameError):
            decode_body(body)


def test_nesting_is_measured_in_objects_too() -> None:
    deep: dict = {"k": 1}
    for _ in range(MAX_NESTING - 1):
        deep = {"k": deep}
    assert decode_body(json.dumps(deep).encode()) == deep
    with pytest.raises(BadFrameError, match=f"nested deeper than {MAX_NESTING}"):
        decode_body(json.dumps({"k": deep}).encode())


def test_a_request_of_too_many_objects_is_a_bad_frame_before_it_is_parsed() -> None:
    """The big-frames storm's 1 MiB of empty objects (and of one-key objects) is refused by
    counting brackets, before any parser builds it: parsed first, each took about 30 ms and 30
    times its size in memory, and 1,000 at once kept the last senders waiting past 30 s. Cut
    short and ended in a byte that is not UTF-8, a frame gets the same answer: nothing parsed it."""
    frames = [('{"op": "ping", "x": [' + ",".join(["{}"] * 340_000) + "]}").encode(),
              json.dumps({"op": "ping", "x": [{"a": 1}] * 120_000}).encode()]
    for frame in frames + [frame[:-2] + b"\xff" for frame in frames]:
        with pytest.raises(BadFrameError, match="more than 10,000 JSON objects and arrays"):
            decode_body(frame)


def test_braces_in_strings_and_escaped_quotes_are_not_counted() -> None:
    tricky = ['{[\\"{[' * 20, '\\', '"', '\\\\"{' * 10]  # escaped quotes and backslashes
    message = {"op": "ping", "x": [tricky] * 300}
    assert decode_body(json.dumps(message).encode()) == message
    with pytest.raises(BadFrameError, match="more than 10,000"):
        decode_body(json.dumps({**message, "y": [[]] * MAX_CONTAINERS}).encode())


def test_braces_in_strings_and_objects_up_to_the_limit_decode() -> None:
    assert decode_body(json.dumps({"op": "ping", "text": "{[" * MAX_CONTAINERS}).encode())["op"] == "ping"
    most = {"op": "ping", "x": [{} for _ in range(MAX_CONTAINERS - 2)]}  # with the frame and the list
    assert decode_body(json.dumps(most).encode()) == most
    with pytest.raises(BadFrameError):
        decode_body(json.dumps({**most, "y": {}}).encode())


def test_encode_never_writes_nan_or_infinity() -> None:
    # NaN and Infinity are not JSON; the protocol has no floats at all (money is a decimal
    # string), so a stray one is written as null rather than as an invalid token
    frame = encode_frame({"a": float("nan"), "b": float("inf")})
    assert decode_body(frame[4:]) == {"a": None, "b": None}


def test_encode_matches_the_standard_librarys_compact_utf8() -> None:
    message = {"id": "é-1", "ok": True, "result": {"items": [{"name": "naïve 🛒", "n": 2**62}], "c": None}}
    expected = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()
    assert encode_frame(message)[4:] == expected


@pytest.mark.parametrize("body", [b"[1]", b"{", b'{"a": NaN}', b"\xff"])
def test_the_trusting_decoder_still_wants_one_json_object(body: bytes) -> None:
    decoder = FrameDecoder(strict=False)
    decoder.feed(len(body).to_bytes(4, "big") + body)
    with pytest.raises(BadFrameError):
        decoder.next_message()


def test_the_trusting_decoder_reads_what_the_strict_one_reads() -> None:
    frame = encode_frame({"id": 1, "ok": True, "result": {"items": [{"a": "😀"}], "next_cursor": None}})
    strict, trusting = FrameDecoder(), FrameDecoder(strict=False)
    for decoder in (strict, trusting):
        decoder.feed(frame)
    assert strict.next_message() == trusting.next_message()
