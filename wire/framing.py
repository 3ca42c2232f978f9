"""Sans-IO framing: a 4-byte big-endian length, then that many bytes of UTF-8 JSON.

FrameDecoder checks the length header before buffering a body, so a hostile length allocates
nothing. JSON is parsed strictly: no NaN/Infinity, duplicate keys, lone surrogates, nesting
past MAX_NESTING or more than MAX_CONTAINERS objects and arrays. A client reading its server's
answers may parse with orjson instead (strict=False, about four times faster).
"""
from __future__ import annotations

import json
import re
import struct
from typing import Any

import orjson

from .errors import BadFrameError, FrameTooLargeError

HEADER = struct.Struct(">I")
DEFAULT_MAX_FRAME = 1 << 20
# JSON nested deeper than this is BAD_FRAME (RFC 8259 lets a parser set the limit): the same
# answer on every Python, whose own parsers stop at different depths (3.11 near 1,000).
MAX_NESTING = 128
# Objects and arrays in one request: thousands past what any op takes, and a bound on the work
# and memory a frame costs to decode.
MAX_CONTAINERS = 10_000
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def encode_frame(message: dict[str, Any]) -> bytes:
    """One message as a frame (ValueError when it cannot be JSON: a lone surrogate, say)."""
    try:
        data = orjson.dumps(message, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits (an echoed id may be one)
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    return HEADER.pack(len(data)) + data


def _reject_constant(name: str) -> Any:
    raise BadFrameError(f"{name} is not allowed in JSON")


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise BadFrameError("duplicate key in JSON object")
    return obj


def _check_tree(value: Any, strings: bool) -> None:
    """BadFrameError if value nests arrays and objects deeper than MAX_NESTING or (if `strings`)
    holds a lone surrogate. A loop, not recursion: the JSON parser of Python 3.12 and later
    accepts nesting deeper than the recursion limit."""
    pending = [(value, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise BadFrameError("lone surrogate in JSON string") from None
            continue
        if depth > MAX_NESTING:
            raise BadFrameError(f"JSON nested deeper than {MAX_NESTING} levels")
        if isinstance(value, dict):
            pending.extend((key, depth) for key in value if strings)
            value = value.values()
        pending.extend((child, depth + 1) for child in value
                       if isinstance(child, (dict, list)) or strings and isinstance(child, str))


def decode_trusted_body(body: bytes) -> dict[str, Any]:
    """Parse one frame's body into a JSON object, without the duplicate-key check."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadFrameError(f"frame is not UTF-8 JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadFrameError("frame is not a JSON object")
    return value


# one decoder for every frame: json.loads with options builds a new one per call (2 µs)
_STRICT_JSON = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_unique_object)


def _too_many_containers(body: bytes) -> bool:
    """Whether the body holds more than MAX_CONTAINERS objects and arrays: its `{` and `[`
    outside strings, counted with bytes methods alone (ten times faster than parsing first)."""
    if body.count(b"[") + body.count(b"{") <= MAX_CONTAINERS:  # else it cannot hold that many
        return False
    # an escaped backslash, then an escaped quote, is no quote; what is left of the quotes
    # alternates: outside a string, inside, outside ...
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(unescaped.split(b'"')[::2])
    return outside.count(b"[") + outside.count(b"{") > MAX_CONTAINERS


def decode_body(body: bytes) -> dict[str, Any]:
    """Parse one frame's body strictly into a JSON object."""
    if _too_many_containers(body):
        raise BadFrameError(f"more than {MAX_CONTAINERS:,} JSON objects and arrays in one request")
    try:
        text = body.decode("utf-8")
        value = _STRICT_JSON.decode(text)
    except BadFrameError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BadFrameError(f"frame is not UTF-8 JSON: {type(exc).__name__}") from None
    if not isinstance(value, dict):
        raise BadFrameError("frame is not a JSON object")
    strings = _SURROGATE_ESCAPE.search(text) is not None
    if strings or body.count(b"[") + body.count(b"{") > MAX_NESTING:  # else it cannot be that deep
        _check_tree(value, strings)
    return value


class FrameDecoder:
    """Bytes in, messages out; raises BadFrameError or FrameTooLargeError on bad input."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME, strict: bool = True) -> None:
        self.max_frame = max_frame
        self._decode = decode_body if strict else decode_trusted_body
        self._buffer = bytearray()
        self._length: int | None = None

    def feed(self, data: bytes) -> None:
        self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes held of a frame not yet complete."""
        return len(self._buffer)

    @property
    def in_frame(self) -> bool:
        """True while part of a frame has arrived but not all of it."""
        return bool(self._buffer) or self._length is not None

    def next_message(self) -> dict[str, Any] | None:
        """The next complete message, or None until more bytes arrive."""
        body = self.next_frame()
        return None if body is None else self._decode(body)

    def decode(self, body: bytes) -> dict[str, Any]:
        """One frame's body (from next_frame) as a message, as next_message would decode it."""
        return self._decode(body)

    def next_frame(self) -> bytes | None:
        """The next complete frame's body, undecoded, or None until more bytes arrive: a
        server can queue a frame at its size and decode it when it answers."""
        if self._length is None:
            if len(self._buffer) < HEADER.size:
                return None
            (length,) = HEADER.unpack_from(self._buffer)
            if length == 0:
                raise BadFrameError("frame length is 0")
            if length > self.max_frame:
                raise FrameTooLargeError(f"frame length {length} is over the limit of {self.max_frame}")
            del self._buffer[: HEADER.size]
            self._length = length
        if len(self._buffer) < self._length:
            return None
        body = bytes(self._buffer[: self._length])
        del self._buffer[: self._length]
        self._length = None
        return body

    def messages(self) -> list[dict[str, Any]]:
        out = []
        while (message := self.next_message()) is not None:
            out.append(message)
        return out
