"""The kubelet's streaming endpoints behind the API server's ``pods/exec``, ``pods/attach`` and
``pods/portforward``: ``/exec/<ns>/<pod>/<container>``, ``/attach/<ns>/<pod>/<container>`` and
``/portForward/<ns>/<pod>``, served on the node's HTTPS port next to the log endpoint.

Every request is upgraded to SPDY/3.1 (``spdy``) after choosing a subprotocol from the client's
``X-Stream-Protocol-Version`` list, as a kubelet does; the API server speaks SPDY to kubelets and
translates kubectl's WebSocket exec (``v5.channel.k8s.io``) and tunnels its WebSocket port-forward
itself, because the node declares no ``ExtendWebSocketsToKubelet`` feature.

Exec and attach (remote command protocol ``v4``/``v3``/``v2.channel.k8s.io``): the client opens one
stream per ``streamType`` (``error``, and ``stdin``/``stdout``/``stderr`` as the query's
``input``/``output``/``error`` ask; with ``tty=1`` no ``stderr`` but ``resize``, JSON terminal
sizes). When the command ends the output streams are finished and the error stream carries the
outcome: with ``v4`` a JSON ``metav1.Status`` (``Success``, or ``NonZeroExitCode`` with an
``ExitCode`` cause), with older versions a message only on failure. Attach has no command: it
follows the container's log (its stdout and stderr) and feeds a ``stdin: true`` container's stdin
until the container stops.

Port-forward (``portforward.k8s.io``): per connection the client opens an ``error`` and a ``data``
stream with the same ``port`` and ``requestID`` headers; the data stream is spliced to a TCP
connection to the pod's IP and that port, and a failure is written to the error stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import struct
import sys
import termios
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from .logserver import read_from
from .spdy import DATA_CHUNK, ProtocolError, Session, Stream

log = logging.getLogger(__name__)
T = TypeVar("T")

PROTOCOL_HEADER = "X-Stream-Protocol-Version"
ACCEPTED_HEADER = "X-Accepted-Stream-Protocol-Versions"
EXEC_PROTOCOLS = ("v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io")
PORT_FORWARD_PROTOCOLS = ("portforward.k8s.io",)
STREAM_CREATION_TIMEOUT = 30.0
"""How long the client may take to open the streams it asked for (a kubelet's default)."""
OUTPUT_DRAIN_SECONDS = 2.0
"""After the command exits, how long its output may still flow (a background child can hold it)."""

# The program that makes the terminal the command's controlling one before it runs the command.
_CONTROLLING_TTY = (
    "import fcntl, os, sys, termios\n"
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


class StreamingError(Exception):
    """Why a request cannot be served, with the HTTP status a kubelet answers."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ExecTarget:
    """How to run a command inside a running container."""

    command: Callable[[Sequence[str]], list[str]]
    """The command as the container sees it -> as this machine runs it (mount paths rewritten)."""
    env: Mapping[str, str]
    cwd: str
    user: Sequence[str] = ()
    """What switches to the container's user before the command (empty: the kubelet's own)."""


@dataclass(frozen=True)
class AttachTarget:
    """A running container's output (its log file, read on from ``offset`` while ``running``) and input."""

    log_path: Path
    offset: int
    running: Callable[[], bool]
    stdin: asyncio.StreamWriter | None = None
    """The container's stdin when its spec has ``stdin: true``."""
    stdin_once: bool = False
    """``stdinOnce``: the container's stdin closes when the attached client finishes its input."""


ExecLocator = Callable[[str, str, str], ExecTarget]
"""(namespace, pod, container) -> the target; raises StreamingError."""
AttachLocator = Callable[[str, str, str], AttachTarget]
PortLocator = Callable[[str, str], str]
"""(namespace, pod) -> the pod's IP; raises StreamingError."""


@dataclass(frozen=True)
class CommandOptions:
    """The query of an exec or attach request, as a kubelet reads it."""

    command: list[str]
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool

    @classmethod
    def from_query(cls, query: Mapping[str, str], command: list[str]) -> CommandOptions:
        tty = query.get("tty") == "1"
        # With a terminal, stderr is the terminal too: the client opens no stream for it.
        stderr = query.get("error") == "1" and not tty
        return cls(command, query.get("input") == "1", query.get("output") == "1", stderr, tty)

    def stream_types(self, protocol: str) -> set[str]:
        wanted = {"error"}
        for name, asked in (("stdin", self.stdin), ("stdout", self.stdout), ("stderr", self.stderr)):
            if asked:
                wanted.add(name)
        if self.tty and protocol != "v2.channel.k8s.io":
            wanted.add("resize")
        return wanted


def negotiate(offered: Sequence[str], supported: Sequence[str]) -> str | None:
    """The first of the client's protocols this server speaks (the client's order wins)."""
    return next((p for p in offered if p in supported), None)


def offered_protocols(request: web.Request) -> list[str]:
    values = request.headers.getall(PROTOCOL_HEADER, [])
    return [p.strip() for value in values for p in value.split(",") if p.strip()]


class _UpgradedReader:
    """Takes the connection's bytes from aiohttp's protocol once the request is upgraded."""

    def __init__(self) -> None:
        self.stream = asyncio.StreamReader(limit=2**31)

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self.stream.feed_data(bytes(data))
        return False, b""

    def feed_eof(self) -> None:
        self.stream.feed_eof()


async def upgrade(
    request: web.Request, supported: Sequence[str], on_stream: Callable[[Stream], None]
) -> tuple[Session, str, web.StreamResponse]:
    """Answer ``101 Switching Protocols`` with ``Upgrade: SPDY/3.1`` and the chosen protocol; the
    connection is then the returned session's (aiohttp parses no more requests from it)."""
    connection = request.headers.get("Connection", "").lower()
    if "upgrade" not in connection or "spdy/3.1" not in request.headers.get("Upgrade", "").lower():
        raise web.HTTPBadRequest(text="unable to upgrade: missing upgrade headers in request")
    offered = offered_protocols(request)
    protocol = negotiate(offered, supported)
    if protocol is None:
        raise web.HTTPForbidden(
            text=f"unable to upgrade: unable to negotiate protocol: client supports {offered}, "
            f"server accepts {list(supported)}",
            headers={ACCEPTED_HEADER: ", ".join(supported)},
        )
    reader = _UpgradedReader()
    assert request.protocol is not None
    request.protocol.set_parser(reader)  # type: ignore[arg-type]  # any feed_data/feed_eof parser
    request.protocol.keep_alive(False)
    response = web.StreamResponse(
        status=101, headers={"Connection": "Upgrade", "Upgrade": "SPDY/3.1", PROTOCOL_HEADER: protocol}
    )
    writer = await response.prepare(request)
    assert writer is not None
    return Session(reader.stream, writer.write, on_stream), protocol, response


async def collect_streams(
    arrived: asyncio.Queue[Stream], wanted: set[str], within: float = STREAM_CREATION_TIMEOUT
) -> dict[str, Stream]:
    """The client's streams by ``streamType``, once every wanted type has arrived."""
    streams: dict[str, Stream] = {}

    async def gather() -> None:
        while not wanted <= streams.keys():
            stream = await arrived.get()
            streams[stream.header("streamType")] = stream

    try:
        await asyncio.wait_for(gather(), within)
    except TimeoutError:
        missing = ", ".join(sorted(wanted - streams.keys()))
        raise StreamingError(f"timed out waiting for the client to create streams: {missing}", 408) from None
    return streams


def exit_status(protocol: str, code: int | None, message: str = "") -> bytes:
    """What the error stream carries when the command is over: ``code`` None for a failure to run
    it (``message`` says why), else its exit code."""
    if protocol != EXEC_PROTOCOLS[0]:
        if code == 0:
            return b""
        if code is None:
            return message.encode()
        return f"command terminated with non-zero exit code: exit status {code}".encode()
    status: dict[str, Any] = {"metadata": {}, "status": "Success"}
    if code is None:
        status = {
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": "InternalError",
            "code": 500,
        }
    elif code != 0:
        status = {
            "metadata": {},
            "status": "Failure",
            "message": f"command terminated with non-zero exit code: exit status {code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }
    return json.dumps(status).encode()


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


async def _pump(source: Stream, sink: asyncio.StreamWriter, *, finish: bool = True) -> None:
    """What the client sends on ``source`` into a process's stdin or a socket until the client
    finishes the stream, then (``finish``) EOF there (a pipe closes, a socket half-closes)."""
    with contextlib.suppress(ConnectionError):
        while data := await source.read():
            sink.write(data)
            await sink.drain()
    if not finish:
        return
    with contextlib.suppress(OSError, RuntimeError):
        if sink.can_write_eof():
            sink.write_eof()
        else:
            sink.close()


async def _drain(source: asyncio.StreamReader, sink: Stream) -> None:
    """The process's output into a stream until the process closes it."""
    with contextlib.suppress(ConnectionError):
        while data := await source.read(DATA_CHUNK):
            await sink.write(data)


def _set_window(terminal: _Terminal, size: Mapping[str, Any]) -> None:
    rows, columns = int(size.get("Height") or 0), int(size.get("Width") or 0)
    if terminal.fd < 0:  # closed: its number may belong to another file by now
        return
    with contextlib.suppress(OSError):
        fcntl.ioctl(terminal.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


async def _resizes(source: Stream, terminal: _Terminal) -> None:
    """Terminal sizes (a JSON object each, one after another) onto the terminal."""
    decoder = json.JSONDecoder()
    pending = ""
    while data := await source.read():
        pending += data.decode(errors="replace")
        while pending.strip():
            try:
                size, end = decoder.raw_decode(pending.lstrip())
            except ValueError:
                break
            if isinstance(size, dict):
                _set_window(terminal, size)
            pending = pending.lstrip()[end:]


@dataclass
class _Terminal:
    """The controlling side of a pseudo-terminal, read without blocking the loop."""

    fd: int
    output: asyncio.StreamReader = field(default_factory=lambda: asyncio.StreamReader(limit=2**31))

    def start(self) -> None:
        os.set_blocking(self.fd, False)
        asyncio.get_running_loop().add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self.fd, DATA_CHUNK)
        except BlockingIOError:
            return
        except OSError:  # EIO: every holder of the terminal's other side is gone
            data = b""
        if data:
            self.output.feed_data(data)
        else:
            self.close()

    async def pump_in(self, source: Stream) -> None:
        with contextlib.suppress(OSError):
            while data := await source.read():
                while data:
                    try:
                        written = os.write(self.fd, data)
                    except BlockingIOError:
                        await asyncio.sleep(0.01)
                        continue
                    data = data[written:]

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self.fd)
        if not self.output.at_eof():
            self.output.feed_eof()
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1


async def _spawn(
    target: ExecTarget, options: CommandOptions
) -> tuple[asyncio.subprocess.Process, _Terminal | None]:
    if options.tty:
        controller, terminal = os.openpty()
        argv = [*target.user, sys.executable, "-c", _CONTROLLING_TTY, *target.command(options.command)]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=terminal,
                stdout=terminal,
                stderr=terminal,
                env=dict(target.env),
                cwd=target.cwd,
                start_new_session=True,
            )
        except BaseException:
            os.close(controller)
            raise
        finally:
            os.close(terminal)
        return process, _Terminal(controller)
    pipe, none = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
    process = await asyncio.create_subprocess_exec(
        *target.user,
        *target.command(options.command),
        stdin=pipe if options.stdin else none,
        stdout=pipe if options.stdout else none,
        stderr=pipe if options.stderr else none,
        env=dict(target.env),
        cwd=target.cwd,
        start_new_session=True,
    )
    return process, None


async def run_command(target: ExecTarget, options: CommandOptions, streams: Mapping[str, Stream]) -> int:
    """Run the command wired to the client's streams; its exit code once it and its output end.
    Processes it leaves in the background live on (until the container stops, like its own); when
    the client goes away first, the command's whole session is killed."""
    process, terminal = await _spawn(target, options)
    feeders: list[asyncio.Task[None]] = []
    outputs: list[asyncio.Task[None]] = []
    if terminal is not None:
        terminal.start()
        if "stdin" in streams:
            feeders.append(asyncio.create_task(terminal.pump_in(streams["stdin"])))
        if "resize" in streams:
            feeders.append(asyncio.create_task(_resizes(streams["resize"], terminal)))
        if "stdout" in streams:
            outputs.append(asyncio.create_task(_drain(terminal.output, streams["stdout"])))
    else:
        if process.stdin is not None:
            feeders.append(asyncio.create_task(_pump(streams["stdin"], process.stdin)))
        for name, pipe in (("stdout", process.stdout), ("stderr", process.stderr)):
            if pipe is not None:
                outputs.append(asyncio.create_task(_drain(pipe, streams[name])))
    try:
        returncode = await process.wait()
        if outputs:
            await asyncio.wait(outputs, timeout=OUTPUT_DRAIN_SECONDS)
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        for task in [*feeders, *outputs]:
            task.cancel()
        await asyncio.gather(*feeders, *outputs, return_exceptions=True)
        if terminal is not None:
            terminal.close()
    return _exit_code(returncode)


async def attach(target: AttachTarget, streams: Mapping[str, Stream]) -> None:
    """Attach: the client's input into the container's stdin (when it has one), the container's
    output to the client, until the container stops."""
    feeder: asyncio.Task[None] | None = None
    if "stdin" in streams and target.stdin is not None:
        feeder = asyncio.create_task(_pump(streams["stdin"], target.stdin, finish=target.stdin_once))
    try:
        await follow_output(target, streams.get("stdout"))
    finally:
        if feeder is not None:
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)


async def follow_output(target: AttachTarget, stdout: Stream | None, poll: float = 0.1) -> None:
    """A running container's output from now on until it stops (attach: the log is its stdout)."""
    offset = target.offset
    while True:
        still_running = target.running()
        chunk = read_from(target.log_path, offset)
        offset += len(chunk)
        if chunk and stdout is not None:
            await stdout.write(chunk)
        if not chunk and not still_running:
            return
        await asyncio.sleep(poll)


class StreamingEndpoints:
    """The node's exec, attach and port-forward handlers (``routes`` for its HTTPS server)."""

    def __init__(self, exec_target: ExecLocator, attach_target: AttachLocator, pod_ip: PortLocator) -> None:
        self._exec_target = exec_target
        self._attach_target = attach_target
        self._pod_ip = pod_ip
        self._sessions: set[asyncio.Task[Any]] = set()

    async def close(self) -> None:
        """End every session (a stopping node): their commands are killed, connections closed.
        The HTTPS server would otherwise wait for them as for any request in progress."""
        for task in list(self._sessions):
            task.cancel()
        await asyncio.gather(*self._sessions, return_exceptions=True)

    @contextlib.contextmanager
    def _session(self) -> Iterator[None]:
        task = asyncio.current_task()
        assert task is not None
        self._sessions.add(task)
        try:
            yield
        finally:
            self._sessions.discard(task)

    def routes(self) -> list[web.RouteDef]:
        paths = (
            ("/exec/{namespace}/{pod}/{container}", self._exec),
            ("/attach/{namespace}/{pod}/{container}", self._attach),
            ("/portForward/{namespace}/{pod}", self._port_forward),
        )
        return [web.route(method, path, handler) for path, handler in paths for method in ("GET", "POST")]

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        command = request.query.getall("command", [])
        if not command:
            raise web.HTTPBadRequest(text="you must specify at least 1 command")
        options = CommandOptions.from_query(request.query, command)
        try:
            target = self._exec_target(info["namespace"], info["pod"], info["container"])
        except StreamingError as error:
            raise _http_error(error) from None

        async def serve(protocol: str, streams: dict[str, Stream]) -> bytes:
            try:
                code = await run_command(target, options, streams)
            except OSError as error:
                return exit_status(protocol, None, f"failed to exec in container: {error}")
            return exit_status(protocol, code)

        return await self._remote_command(request, options, serve)

    async def _attach(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        options = CommandOptions.from_query(request.query, [])
        try:
            target = self._attach_target(info["namespace"], info["pod"], info["container"])
        except StreamingError as error:
            raise _http_error(error) from None

        async def serve(protocol: str, streams: dict[str, Stream]) -> bytes:
            await attach(target, streams)
            return exit_status(protocol, 0)

        return await self._remote_command(request, options, serve)

    async def _remote_command(
        self,
        request: web.Request,
        options: CommandOptions,
        serve: Callable[[str, dict[str, Stream]], Awaitable[bytes]],
    ) -> web.StreamResponse:
        arrived: asyncio.Queue[Stream] = asyncio.Queue()
        session, protocol, response = await upgrade(request, EXEC_PROTOCOLS, arrived.put_nowait)
        reading = asyncio.create_task(session.run())
        with self._session():
            try:
                streams = await _first(collect_streams(arrived, options.stream_types(protocol)), reading)
                outcome = await _first(serve(protocol, streams), reading) if streams is not None else None
                if streams is not None and outcome is not None:
                    await _finish(session, streams, outcome)
            except StreamingError as error:
                log.info("%s: %s", request.path, error)
            except ConnectionError:
                pass
            finally:
                reading.cancel()
                for result in await asyncio.gather(reading, return_exceptions=True):
                    if isinstance(result, ProtocolError):
                        log.info("%s: %s", request.path, result)
        return response

    async def _port_forward(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        try:
            pod_ip = self._pod_ip(info["namespace"], info["pod"])
        except StreamingError as error:
            raise _http_error(error) from None
        forwarder = _PortForwarder(pod_ip, f"{info['namespace']}/{info['pod']}")
        session, _, response = await upgrade(request, PORT_FORWARD_PROTOCOLS, forwarder.add)
        with self._session():
            try:
                await session.run()
            except ProtocolError as error:
                log.info("%s: %s", request.path, error)
            finally:
                await forwarder.stop()
        return response


def _http_error(error: StreamingError) -> web.HTTPException:
    kinds: dict[int, type[web.HTTPException]] = {400: web.HTTPBadRequest, 404: web.HTTPNotFound}
    return kinds.get(error.status, web.HTTPInternalServerError)(text=str(error))


async def _first(work: Awaitable[T], reading: asyncio.Task[None]) -> T | None:
    """``work``'s result, or None when the connection ends first (``work`` is then cancelled)."""
    task = asyncio.ensure_future(work)
    await asyncio.wait([task, reading], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None


async def _finish(session: Session, streams: Mapping[str, Stream], outcome: bytes) -> None:
    """End of a command: its output streams finished, the outcome on the error stream, GOAWAY."""
    for name in ("stdout", "stderr", "stdin", "resize"):
        if name in streams:
            await streams[name].close()
    error = streams["error"]
    if outcome:
        await error.write(outcome)
    await error.close()
    await session.go_away()


class _PortForwarder:
    """Pairs each connection's error and data streams by ``requestID`` and splices the data stream
    to the pod's port."""

    def __init__(self, pod_ip: str, pod: str) -> None:
        self._pod_ip = pod_ip
        self._pod = pod
        self._pending: dict[str, dict[str, Stream]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def add(self, stream: Stream) -> None:
        kind = stream.header("streamType")
        if kind not in ("data", "error"):
            task = asyncio.create_task(stream.session.reset(stream))
        else:
            pair = self._pending.setdefault(stream.header("requestID"), {})
            pair[kind] = stream
            if len(pair) < 2:
                return
            del self._pending[stream.header("requestID")]
            task = asyncio.create_task(self._forward(pair["data"], pair["error"]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _forward(self, data: Stream, error: Stream) -> None:
        port_header = data.header("port")
        try:
            port = int(port_header)
            if not 0 < port < 65536:
                raise ValueError(port_header)
            reader, writer = await asyncio.open_connection(self._pod_ip, port)
        except (ValueError, OSError) as failure:
            with contextlib.suppress(ConnectionError):
                await error.write(
                    f"error forwarding port {port_header} to pod {self._pod}: {failure}".encode()
                )
                await error.close()
                await data.close()
            return
        try:
            upstream = asyncio.create_task(_pump(data, writer))
            await _drain(reader, data)
            with contextlib.suppress(ConnectionError):
                await data.close()
                await error.close()
            await asyncio.wait([upstream], timeout=1)
            upstream.cancel()
        finally:
            writer.close()

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
