"""The remote command protocol's pieces the kubelet's exec endpoint decides by itself: the protocol
chosen from the client's list, the streams it waits for, and the outcome on the error stream that
client-go turns into kubectl's exit code; then the endpoints themselves, spoken to over a plain
connection as the API server speaks to a kubelet."""

from __future__ import annotations

import asyncio
import json
import os

from aiohttp import web
from rtj_localcluster import spdy
from rtj_localcluster.streaming import (
    EXEC_PROTOCOLS,
    AttachTarget,
    CommandOptions,
    ExecTarget,
    StreamingEndpoints,
    StreamingError,
    exit_status,
    negotiate,
)


def test_the_clients_order_chooses_among_the_protocols_the_kubelet_speaks() -> None:
    offered = ["v5.channel.k8s.io", "v4.channel.k8s.io", "v3.channel.k8s.io"]
    assert negotiate(offered, EXEC_PROTOCOLS) == "v4.channel.k8s.io"
    assert negotiate(["v3.channel.k8s.io", "v4.channel.k8s.io"], EXEC_PROTOCOLS) == "v3.channel.k8s.io"
    assert negotiate(["v5.channel.k8s.io"], EXEC_PROTOCOLS) is None


def test_a_terminal_replaces_stderr_by_a_resize_stream() -> None:
    plain = CommandOptions.from_query({"input": "1", "output": "1", "error": "1"}, ["cat"])
    assert plain.stream_types("v4.channel.k8s.io") == {"error", "stdin", "stdout", "stderr"}
    tty = CommandOptions.from_query({"input": "1", "output": "1", "error": "1", "tty": "1"}, ["sh"])
    assert (tty.tty, tty.stderr) == (True, False)
    assert tty.stream_types("v4.channel.k8s.io") == {"error", "stdin", "stdout", "resize"}
    assert tty.stream_types("v2.channel.k8s.io") == {"error", "stdin", "stdout"}


def test_v4_reports_the_exit_code_as_a_status_cause() -> None:
    assert json.loads(exit_status("v4.channel.k8s.io", 0)) == {"metadata": {}, "status": "Success"}
    failed = json.loads(exit_status("v4.channel.k8s.io", 3))
    assert (failed["status"], failed["reason"]) == ("Failure", "NonZeroExitCode")
    assert failed["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]
    broken = json.loads(exit_status("v4.channel.k8s.io", None, "no such file"))
    assert (broken["status"], broken["message"]) == ("Failure", "no such file")
    # Before v4 the error stream stays empty on success and carries a message otherwise.
    assert exit_status("v3.channel.k8s.io", 0) == b""
    assert b"exit status 3" in exit_status("v3.channel.k8s.io", 3)


class Client:
    """A SPDY client over a plain connection to the endpoints (what the API server is to a kubelet)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.compressor = spdy.HeaderCompressor()
        self.parser = spdy.FrameParser()
        self.frames: list[spdy.Frame] = []

    @classmethod
    async def upgrade(cls, port: int, target: str, protocol: str) -> tuple[Client, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"POST {target} HTTP/1.1\r\nHost: node\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
            f"X-Stream-Protocol-Version: v5.channel.k8s.io, {protocol}\r\nContent-Length: 0\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        return cls(reader, writer), head

    def open(self, stream_id: int, headers: dict[str, list[str]]) -> None:
        block = self.compressor.compress(headers)
        self.writer.write(spdy.control_frame(spdy.SYN_STREAM, spdy.syn_stream_payload(stream_id, block)))

    async def read_until_finished(self, stream_id: int) -> dict[int, bytes]:
        """Data per stream until ``stream_id`` is finished."""
        while not any(f.stream_id == stream_id and f.fin and not f.control for f in self.frames):
            data = await asyncio.wait_for(self.reader.read(65536), 10)
            assert data, "connection closed early"
            self.frames += self.parser.feed(data)
        received: dict[int, bytes] = {}
        for frame in self.frames:
            if not frame.control:
                received[frame.stream_id] = received.get(frame.stream_id, b"") + frame.payload
        return received


async def _serve(endpoints: StreamingEndpoints) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.add_routes(endpoints.routes())
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, int(runner.addresses[0][1])


def _endpoints() -> StreamingEndpoints:
    def exec_target(namespace: str, pod: str, container: str) -> ExecTarget:
        return ExecTarget(list, dict(os.environ), "/")

    def attach_target(namespace: str, pod: str, container: str) -> AttachTarget:
        raise StreamingError("no attach here")

    return StreamingEndpoints(exec_target, attach_target, lambda namespace, pod: "127.0.0.1")


async def _exec_and_close() -> None:
    endpoints = _endpoints()
    runner, port = await _serve(endpoints)
    try:
        query = "command=sh&command=-c&command=read+x%3B+echo+got+$x%3B+exit+3&input=1&output=1"
        client, head = await Client.upgrade(port, f"/exec/ns/pod/c?{query}", "v4.channel.k8s.io")
        assert head.startswith(b"HTTP/1.1 101")
        assert b"X-Stream-Protocol-Version: v4.channel.k8s.io" in head
        assert b"Upgrade: SPDY/3.1" in head
        client.open(1, {"streamtype": ["error"]})
        client.open(3, {"streamtype": ["stdin"]})
        client.open(5, {"streamtype": ["stdout"]})
        client.writer.write(spdy.data_frame(3, b"hi\n", fin=True))
        received = await client.read_until_finished(1)
        assert received[5] == b"got hi\n"
        assert json.loads(received[1])["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]
        client.writer.close()

        # A session still open when the node stops ends at once (the server would wait for it).
        forward, head = await Client.upgrade(port, "/portForward/ns/pod", "portforward.k8s.io")
        assert head.startswith(b"HTTP/1.1 101")
        await asyncio.sleep(0.1)
        await asyncio.wait_for(endpoints.close(), 5)
        assert await asyncio.wait_for(forward.reader.read(), 5) == b""
        forward.writer.close()
    finally:
        await asyncio.wait_for(runner.cleanup(), 10)


def test_exec_over_spdy_and_sessions_end_when_the_node_stops() -> None:
    asyncio.run(_exec_and_close())
