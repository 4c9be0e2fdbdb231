"""SPDY/3.1 framing of the kubelet's streaming endpoints: frame layout, the compressed header blocks
(against frames written by Go's SPDY framer, moby/spdystream, the API server's and kubectl's), and a
session serving the streams a peer opens."""

from __future__ import annotations

import asyncio
import struct
import zlib

import pytest
from rtj_localcluster import spdy

# Two SYN_STREAM frames written one after the other by moby/spdystream's Framer (v0.5.1): stream 1
# with streamType=error, port=9410, requestID=0; stream 3 with FIN and streamType=data. The second
# block continues the first one's zlib stream, as every block of a session does.
GO_SYN_STREAMS = (
    "800300010000003d0000000100000000000078f9e3c6a7c202253a48f95b044eeaa054c1c0c0c0590489af4c50"
    "3a663400a7c492a2d4c45c6861c39a0a8a0a00000000ffff",
    "80030001010000180000000300000000000002c9614881caa14400000000ffff",
)


def test_the_dictionary_is_the_one_of_the_spec() -> None:
    # SPDY/3 section 2.6.10.1: 1423 bytes; a zlib stream primed with it names it by its Adler-32
    # (the DICTID every compressed header block of a session starts with).
    assert len(spdy.HEADER_DICTIONARY) == 1423
    assert zlib.adler32(spdy.HEADER_DICTIONARY) == 0xE3C6A7C2
    assert spdy.HEADER_DICTIONARY.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert spdy.HEADER_DICTIONARY.endswith(b",*,enq=0.")
    block = spdy.HeaderCompressor().compress({"streamtype": ["error"]})
    assert block[0] & 0x0F == 8 and block[1] & 0x20, "a zlib header with a preset dictionary"
    assert block[2:6] == bytes.fromhex("e3c6a7c2")
    assert block.endswith(b"\x00\x00\xff\xff"), "each block ends with a sync flush"


def test_header_blocks_written_by_go_decode_in_one_zlib_stream() -> None:
    parser = spdy.FrameParser()
    decompressor = spdy.HeaderDecompressor()
    frames = [frame for vector in GO_SYN_STREAMS for frame in parser.feed(bytes.fromhex(vector))]
    assert [(f.control, f.kind, f.flags, f.stream_id) for f in frames] == [
        (True, spdy.SYN_STREAM, 0, 1),
        (True, spdy.SYN_STREAM, spdy.FLAG_FIN, 3),
    ]
    assert decompressor.decompress(frames[0].payload[10:]) == {
        "streamtype": ["error"],
        "port": ["9410"],
        "requestid": ["0"],
    }
    assert decompressor.decompress(frames[1].payload[10:]) == {"streamtype": ["data"]}


def test_header_block_layout_and_round_trip() -> None:
    block = spdy.encode_header_block({"Port": ["80"], "accept": ["a", "b"]})
    assert block == (
        struct.pack(">I", 2)
        + struct.pack(">I", 4)
        + b"port"
        + struct.pack(">I", 2)
        + b"80"
        + struct.pack(">I", 6)
        + b"accept"
        + struct.pack(">I", 3)
        + b"a\0b"
    )
    assert spdy.decode_header_block(block) == {"port": ["80"], "accept": ["a", "b"]}
    compressor, decompressor = spdy.HeaderCompressor(), spdy.HeaderDecompressor()
    for headers in ({}, {"streamtype": ["stdout"]}, {"streamtype": ["stdout"], "x": ["1", "2"]}):
        assert decompressor.decompress(compressor.compress(headers)) == headers
    with pytest.raises(spdy.ProtocolError):
        spdy.decode_header_block(block[:-1])


def test_frames_encode_as_the_spec_lays_them_out_and_parse_in_pieces() -> None:
    assert spdy.data_frame(5, b"hi", fin=True) == bytes.fromhex("0000000501000002") + b"hi"
    ping = spdy.control_frame(spdy.PING, struct.pack(">I", 1))
    assert ping == bytes.fromhex("800300060000000400000001")
    wire = ping + spdy.data_frame(7, b"x" * 70_000) + spdy.data_frame(7, b"", fin=True)
    parser = spdy.FrameParser()
    pieces = [wire[offset : offset + 999] for offset in range(0, len(wire), 999)]
    frames = [frame for piece in pieces for frame in parser.feed(piece)]
    assert [(f.control, f.kind, f.stream_id, len(f.payload), f.fin) for f in frames] == [
        (True, spdy.PING, 0, 4, False),
        (False, 0, 7, 70_000, False),
        (False, 0, 7, 0, True),
    ]
    with pytest.raises(spdy.ProtocolError):
        spdy.FrameParser().feed(bytes.fromhex("800200060000000400000001"))


class Peer:
    """The client end of a session under test: writes frames into it, reads what it answers."""

    def __init__(self) -> None:
        self.to_server = asyncio.StreamReader()
        self.from_server = spdy.FrameParser()
        self.received: list[spdy.Frame] = []
        self.compressor = spdy.HeaderCompressor()
        self.decompressor = spdy.HeaderDecompressor()

    async def write(self, data: bytes) -> None:
        self.received += self.from_server.feed(data)

    def open(self, stream_id: int, headers: dict[str, list[str]], *, fin: bool = False) -> None:
        block = self.compressor.compress(headers)
        payload = spdy.syn_stream_payload(stream_id, block)
        self.to_server.feed_data(spdy.control_frame(spdy.SYN_STREAM, payload, spdy.FLAG_FIN if fin else 0))


async def _session_round_trip() -> None:
    peer = Peer()
    opened: list[spdy.Stream] = []
    session = spdy.Session(peer.to_server, peer.write, opened.append)
    running = asyncio.create_task(session.run())
    peer.open(1, {"streamtype": ["stdin"]})
    peer.open(3, {"streamtype": ["stdout"]})
    peer.to_server.feed_data(spdy.data_frame(1, b"hello ") + spdy.data_frame(1, b"world", fin=True))
    peer.to_server.feed_data(spdy.control_frame(spdy.PING, struct.pack(">I", 7)))
    await asyncio.sleep(0.05)
    assert [s.header("streamType") for s in opened] == ["stdin", "stdout"]
    assert await opened[0].read_all() == b"hello world"
    await opened[1].write(b"out")
    await opened[1].close()
    replies = [f for f in peer.received if f.control and f.kind == spdy.SYN_REPLY]
    assert [f.stream_id for f in replies] == [1, 3]
    assert all(peer.decompressor.decompress(f.payload[4:]) == {} for f in replies)
    assert any(f.control and f.kind == spdy.PING and f.payload == struct.pack(">I", 7) for f in peer.received)
    data = [(f.stream_id, f.payload, f.fin) for f in peer.received if not f.control]
    assert data == [(3, b"out", False), (3, b"", True)]
    peer.to_server.feed_data(spdy.control_frame(spdy.RST_STREAM, struct.pack(">II", 3, spdy.RST_CANCEL)))
    peer.to_server.feed_data(spdy.control_frame(spdy.GOAWAY, struct.pack(">II", 3, 0)))
    await asyncio.wait_for(running, 5)
    assert await opened[1].read() == b""


def test_session_replies_to_streams_and_carries_their_data() -> None:
    asyncio.run(_session_round_trip())
