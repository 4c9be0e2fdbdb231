"""An asyncio event loop in a background thread that other threads hand coroutines to: the local
cluster's informers, controllers and kubelets run on one, and its fault methods, called from any
thread, run there too."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """One event loop, run by one daemon thread from ``start()`` to ``stop()``."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    def start(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        """Run `coroutine` on the loop and wait for its result (its exception is raised here)."""
        if self._loop is None:
            coroutine.close()
            raise RuntimeError("the local cluster is not running")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()  # do not leave it running on the loop that stop() is about to close
            raise

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> None:
        """A task that runs until ``cancel_tasks``; called on the loop."""
        self._tasks.append(asyncio.get_running_loop().create_task(coroutine, name=name))

    async def cancel_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def stop(self, last: Callable[[], Coroutine[Any, Any, None]], timeout: float = 30) -> None:
        """Run `last()` on the loop (its errors ignored: this is shutdown), then end the loop and
        its thread. Nothing when the loop is not running."""
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(Exception):
                self.call(last(), timeout=timeout)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            if not thread.is_alive():
                loop.close()
        self._loop = self._thread = None
