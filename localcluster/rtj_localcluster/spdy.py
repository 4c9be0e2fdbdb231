"""SPDY/3.1 framing and the server side of a session: what the API server speaks to a kubelet's
streaming endpoints (exec, attach, port-forward) once they answered ``Upgrade: SPDY/3.1``.

Frames (SPDY/3 section 2.2): a control frame is ``1 | version (15 bits) | type (16) | flags (8) |
length (24)`` and its payload; a data frame is ``0 | stream id (31) | flags (8) | length (24)`` and
its data. A header block (SYN_STREAM, SYN_REPLY, HEADERS) is a 32-bit count, then per name a 32-bit
length and the lower-case name, a 32-bit length and the value (a name's several values joined by
NUL). Header blocks are compressed by one zlib stream per direction that lives as long as the
session, primed with the dictionary of section 2.6.10.1 and sync-flushed after each block.

The peer opens the streams (kubectl, or the API server's own SPDY client), and each gets a
SYN_REPLY at once, as a kubelet's connection does. Flow control is not enforced either way: the
Go peers (moby/spdystream) neither send WINDOW_UPDATE nor honor it, so it is read and ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

VERSION = 3
SYN_STREAM = 1
SYN_REPLY = 2
RST_STREAM = 3
SETTINGS = 4
PING = 6
GOAWAY = 7
HEADERS = 8
WINDOW_UPDATE = 9

FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02

RST_PROTOCOL_ERROR = 1
RST_INVALID_STREAM = 2
RST_CANCEL = 5
GOAWAY_OK = 0

MAX_LENGTH = 0xFFFFFF
DATA_CHUNK = 32 * 1024
_STREAM_ID_MASK = 0x7FFFFFFF

# The header dictionary of SPDY/3 section 2.6.10.1: these names and values, each with its 32-bit
# length in front, then the status codes, reason phrases and common values as one run of text.
_DICTIONARY_WORDS = (
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
)
_DICTIONARY_TEXT = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request"
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented"
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 "
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,"
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age="
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)
HEADER_DICTIONARY = (
    b"".join(struct.pack(">I", len(word)) + word.encode() for word in _DICTIONARY_WORDS)
    + _DICTIONARY_TEXT.encode()
)

Headers = dict[str, list[str]]


class ProtocolError(Exception):
    """The peer sent something that is not SPDY/3."""


@dataclass(frozen=True)
class Frame:
    """One frame: a control frame (``kind`` its type) or a data frame (``kind`` 0)."""

    control: bool
    kind: int
    flags: int
    payload: bytes
    stream_id: int = 0
    """The data frame's stream; for control frames the one their payload starts with (0 for none)."""

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


def control_frame(kind: int, payload: bytes, flags: int = 0) -> bytes:
    if len(payload) > MAX_LENGTH:
        raise ValueError(f"control frame of {len(payload)} bytes")
    return struct.pack(">HHI", 0x8000 | VERSION, kind, (flags << 24) | len(payload)) + payload


def data_frame(stream_id: int, data: bytes, *, fin: bool = False) -> bytes:
    if len(data) > MAX_LENGTH:
        raise ValueError(f"data frame of {len(data)} bytes")
    flags = FLAG_FIN if fin else 0
    return struct.pack(">II", stream_id & _STREAM_ID_MASK, (flags << 24) | len(data)) + data


def _stream_of(kind: int, payload: bytes) -> int:
    if kind in (SYN_STREAM, SYN_REPLY, RST_STREAM, HEADERS, WINDOW_UPDATE) and len(payload) >= 4:
        return int(struct.unpack_from(">I", payload)[0]) & _STREAM_ID_MASK
    return 0


class FrameParser:
    """Cuts a byte stream into frames, however it arrives in pieces."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames: list[Frame] = []
        while len(self._buffer) >= 8:
            first, flags_length = struct.unpack_from(">II", self._buffer)
            length = flags_length & MAX_LENGTH
            if len(self._buffer) < 8 + length:
                break
            payload = bytes(self._buffer[8 : 8 + length])
            del self._buffer[: 8 + length]
            flags = flags_length >> 24
            if first & 0x80000000:
                version, kind = (first >> 16) & 0x7FFF, first & 0xFFFF
                if version != VERSION:
                    raise ProtocolError(f"SPDY version {version}, not {VERSION}")
                frames.append(Frame(True, kind, flags, payload, _stream_of(kind, payload)))
            else:
                frames.append(Frame(False, 0, flags, payload, first & _STREAM_ID_MASK))
        return frames


def encode_header_block(headers: Mapping[str, Sequence[str]]) -> bytes:
    """The uncompressed block: names lower-cased, a name's values joined by NUL."""
    parts = [struct.pack(">I", len(headers))]
    for name, values in headers.items():
        key, value = name.lower().encode(), "\0".join(values).encode()
        parts += [struct.pack(">I", len(key)), key, struct.pack(">I", len(value)), value]
    return b"".join(parts)


def decode_header_block(block: bytes) -> Headers:
    def take(offset: int) -> tuple[bytes, int]:
        if offset + 4 > len(block):
            raise ProtocolError("truncated header block")
        (length,) = struct.unpack_from(">I", block, offset)
        end = offset + 4 + length
        if end > len(block):
            raise ProtocolError("truncated header block")
        return block[offset + 4 : end], end

    if len(block) < 4:
        raise ProtocolError("truncated header block")
    (count,) = struct.unpack_from(">I", block)
    headers: Headers = {}
    offset = 4
    for _ in range(count):
        name, offset = take(offset)
        value, offset = take(offset)
        headers.setdefault(name.decode().lower(), []).extend(value.decode().split("\0"))
    return headers


class HeaderCompressor:
    """The sending direction's zlib stream."""

    def __init__(self) -> None:
        self._zlib = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, 15, zdict=HEADER_DICTIONARY)

    def compress(self, headers: Mapping[str, Sequence[str]]) -> bytes:
        return self._zlib.compress(encode_header_block(headers)) + self._zlib.flush(zlib.Z_SYNC_FLUSH)


class HeaderDecompressor:
    """The receiving direction's zlib stream."""

    def __init__(self) -> None:
        self._zlib = zlib.decompressobj(zdict=HEADER_DICTIONARY)

    def decompress(self, block: bytes) -> Headers:
        try:
            return decode_header_block(self._zlib.decompress(block))
        except zlib.error as error:
            raise ProtocolError(f"header block: {error}") from error


def syn_stream_payload(stream_id: int, block: bytes, *, associated: int = 0, priority: int = 0) -> bytes:
    """A SYN_STREAM's payload around an already compressed header block."""
    return struct.pack(">IIBB", stream_id, associated, (priority & 7) << 5, 0) + block


def syn_reply_payload(stream_id: int, block: bytes) -> bytes:
    return struct.pack(">I", stream_id) + block


class Stream:
    """One stream the peer opened: its headers, what it sent (``read``), and our half."""

    def __init__(self, session: Session, stream_id: int, headers: Headers, *, remote_done: bool) -> None:
        self.session = session
        self.id = stream_id
        self.headers = headers
        self._incoming = asyncio.StreamReader(limit=2**31)
        self.local_done = False
        if remote_done:
            self._incoming.feed_eof()

    def header(self, name: str) -> str:
        values = self.headers.get(name.lower()) or [""]
        return values[0]

    async def read(self, size: int = DATA_CHUNK) -> bytes:
        """What the peer sent next; b"" once it finished its half (FIN) or reset the stream."""
        return await self._incoming.read(size)

    async def read_all(self) -> bytes:
        return await self._incoming.read()

    async def write(self, data: bytes) -> None:
        for start in range(0, len(data), DATA_CHUNK):
            if self.local_done:
                return
            await self.session.send(data_frame(self.id, data[start : start + DATA_CHUNK]))

    async def close(self) -> None:
        """Finish our half of the stream (a data frame with FIN)."""
        if not self.local_done:
            self.local_done = True
            await self.session.send(data_frame(self.id, b"", fin=True))

    def _received(self, data: bytes, fin: bool) -> None:
        if self._incoming.at_eof():
            return
        if data:
            self._incoming.feed_data(data)
        if fin:
            self._incoming.feed_eof()

    def _reset(self) -> None:
        self.local_done = True
        if not self._incoming.at_eof():
            self._incoming.feed_eof()


Writer = Callable[[bytes], Awaitable[None]]


class Session:
    """The server end of one SPDY connection. ``run`` reads frames until the peer goes away,
    replying to each new stream and handing it to ``on_stream``; ``send`` writes whole frames."""

    def __init__(
        self, reader: asyncio.StreamReader, write: Writer, on_stream: Callable[[Stream], None]
    ) -> None:
        self._reader = reader
        self._write = write
        self._on_stream = on_stream
        self._lock = asyncio.Lock()
        self._compressor = HeaderCompressor()
        self._decompressor = HeaderDecompressor()
        self._parser = FrameParser()
        self.streams: dict[int, Stream] = {}
        self.closed = False

    async def send(self, frame: bytes) -> None:
        async with self._lock:
            if self.closed:
                raise ConnectionResetError("SPDY session closed")
            await self._write(frame)

    async def _reply(self, stream_id: int, headers: Mapping[str, Sequence[str]]) -> None:
        # Compressing and writing under one lock keeps the peer's zlib stream in the same order.
        async with self._lock:
            if self.closed:
                raise ConnectionResetError("SPDY session closed")
            block = self._compressor.compress(headers)
            await self._write(control_frame(SYN_REPLY, syn_reply_payload(stream_id, block)))

    async def run(self) -> None:
        """Serve frames until the connection ends or the peer sends GOAWAY; then every stream ends."""
        try:
            while not self.closed:
                data = await self._reader.read(64 * 1024)
                if not data:
                    break
                for frame in self._parser.feed(data):
                    if not await self._handle(frame):
                        return
        finally:
            self.closed = True
            for stream in self.streams.values():
                stream._reset()

    async def _handle(self, frame: Frame) -> bool:
        """Act on one frame; False when the session is over."""
        if not frame.control:
            stream = self.streams.get(frame.stream_id)
            if stream is not None:
                stream._received(frame.payload, frame.fin)
            return True
        if frame.kind == SYN_STREAM:
            await self._open(frame)
        elif frame.kind == RST_STREAM:
            stream = self.streams.pop(frame.stream_id, None)
            if stream is not None:
                stream._reset()
        elif frame.kind == HEADERS:
            self._decompressor.decompress(frame.payload[4:])  # keeps the zlib stream in step
            stream = self.streams.get(frame.stream_id)
            if stream is not None and frame.fin:
                stream._received(b"", True)
        elif frame.kind == PING:
            await self.send(control_frame(PING, frame.payload))
        elif frame.kind == GOAWAY:
            return False
        # SETTINGS, WINDOW_UPDATE (no flow control here) and unknown types are ignored.
        return True

    async def _open(self, frame: Frame) -> None:
        if len(frame.payload) < 10:
            raise ProtocolError("short SYN_STREAM")
        headers = self._decompressor.decompress(frame.payload[10:])
        stream = Stream(self, frame.stream_id, headers, remote_done=bool(frame.flags & FLAG_FIN))
        self.streams[frame.stream_id] = stream
        await self._reply(frame.stream_id, {})
        self._on_stream(stream)

    async def reset(self, stream: Stream, status: int = RST_CANCEL) -> None:
        stream._reset()
        self.streams.pop(stream.id, None)
        with contextlib.suppress(ConnectionError):
            await self.send(control_frame(RST_STREAM, struct.pack(">II", stream.id, status)))

    async def go_away(self) -> None:
        """Tell the peer no more streams will be served (GOAWAY, last good stream, status OK)."""
        last = max(self.streams, default=0)
        with contextlib.suppress(ConnectionError):
            await self.send(control_frame(GOAWAY, struct.pack(">II", last, GOAWAY_OK)))
        self.closed = True
