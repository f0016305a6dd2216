"""Servers: Python handlers (`def` or `async def`) for the four call kinds."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import queue
import threading
import time
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Dict,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Sequence,
)

from . import _health, _native, _reflection
from ._client import PathLike, send_async
from ._errors import Code, Metadata, MetadataValue, StatusError
from ._health import Health
from ._loop import completer

KINDS = ("unary", "server_streaming", "client_streaming", "streaming")


class MethodHandler(NamedTuple):
    """One method of a service: how to decode its requests and what to call."""

    name: str  # "/pkg.Service/Method"
    kind: str  # one of KINDS
    handler: Callable[..., Any]
    request_type: Any
    response_type: Any


class ServicerContext:
    """What a handler knows about its call, and how it sets metadata or fails."""

    __slots__ = ("_call", "method", "_deadline", "_headers", "_trailers")

    def __init__(self, call: _native.ServerCall, method: str) -> None:
        self._call = call
        self.method = method
        rem = call.remaining
        self._deadline = None if rem is None else time.monotonic() + rem
        self._headers: Optional[List[tuple[str, MetadataValue]]] = None
        self._trailers: Optional[List[tuple[str, MetadataValue]]] = None

    def invocation_metadata(self) -> list[tuple[str, MetadataValue]]:
        """The request metadata."""
        return self._call.metadata()

    def peer(self) -> Optional[str]:
        """The client's address (`ip:port`, or `unix:...`)."""
        return self._call.peer

    def time_remaining(self) -> Optional[float]:
        """Seconds to the call's deadline (None: no deadline)."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def is_cancelled(self) -> bool:
        """Whether the call was cancelled (client, deadline, lost connection, shutdown)."""
        return self._call.is_cancelled()

    def set_initial_metadata(self, md: Metadata) -> None:
        """Response headers (unary replies)."""
        self._headers = (self._headers or []) + list(md)

    def set_trailing_metadata(self, md: Metadata) -> None:
        """Trailers sent with the status (unary replies and errors)."""
        self._trailers = (self._trailers or []) + list(md)

    def abort(self, code: Code, message: str = "", details: bytes = b"") -> None:
        """Ends the call with a status (raises)."""
        raise StatusError(code, message, details, self._trailers)


def _fail(call: _native.ServerCall, e: BaseException, ctx: ServicerContext) -> None:
    if isinstance(e, StatusError):
        headers = (ctx._headers or []) + e.headers
        call.finish_err(
            int(e.code), e.message, e.details, e.trailers or ctx._trailers, headers or None
        )
    elif isinstance(e, asyncio.CancelledError):
        call.finish_err(int(Code.CANCELLED), "the handler was cancelled")
    else:
        call.finish_err(int(Code.INTERNAL), f"{type(e).__name__}: {e}", None, ctx._trailers or None)


class _SyncRequests:
    def __init__(self, stream: _native.MessageStream, decode: Any) -> None:
        self._s = stream
        self._d = decode

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        b = self._s.next()
        if b is None:
            raise StopIteration
        return self._d(b)


class _AsyncRequests:
    def __init__(self, stream: _native.MessageStream, decode: Any) -> None:
        self._s = stream
        self._d = decode

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._s.next_async(completer(loop), fut)
        b = await fut
        if b is None:
            raise StopAsyncIteration
        return self._d(b)


def _run_sync(m: MethodHandler, call: _native.ServerCall) -> None:
    ctx = ServicerContext(call, m.name)
    sender: Optional[_native.Sender] = None
    try:
        decode = m.request_type.FromString
        if m.kind in ("unary", "server_streaming"):
            req: Any = decode(call.request())
        else:
            req = _SyncRequests(call.requests(), decode)
        if m.kind in ("unary", "client_streaming"):
            resp = m.handler(req, ctx)
            call.finish_ok(resp.SerializeToString(), ctx._trailers, ctx._headers)
        else:
            sender = call.sender()
            first = True
            for r in m.handler(req, ctx):
                if first:  # headers set before the first message go with it
                    call.send_headers(ctx._headers)
                    first = False
                if not sender.send(r.SerializeToString()):
                    break
            call.finish_ok(None, ctx._trailers, ctx._headers)
    except BaseException as e:  # noqa: BLE001 - a handler's failure ends only its call
        _fail(call, e, ctx)
    finally:
        # The response stream ends only when every sender is gone; the handler's exception
        # may keep this frame (so `sender`) alive through its traceback, in a cycle.
        if sender is not None:
            sender.close()


async def _run_async(
    m: MethodHandler, call: _native.ServerCall, tasks: Dict[int, "asyncio.Task[None]"]
) -> None:
    ctx = ServicerContext(call, m.name)
    sender: Optional[_native.Sender] = None
    try:
        decode = m.request_type.FromString
        if m.kind in ("unary", "server_streaming"):
            req: Any = decode(call.request())
        else:
            req = _AsyncRequests(call.requests(), decode)
        if m.kind in ("unary", "client_streaming"):
            resp = await m.handler(req, ctx)
            call.finish_ok(resp.SerializeToString(), ctx._trailers, ctx._headers)
        else:
            sender = call.sender()
            out = m.handler(req, ctx)
            if inspect.isawaitable(out):
                out = await out
            first = True
            async for r in out:
                if first:  # headers set before the first message go with it
                    call.send_headers(ctx._headers)
                    first = False
                if not await send_async(sender, r.SerializeToString()):
                    break
            call.finish_ok(None, ctx._trailers, ctx._headers)
    except BaseException as e:  # noqa: BLE001 - a handler's failure ends only its call
        _fail(call, e, ctx)
    finally:
        tasks.pop(call.id, None)
        if sender is not None:  # (as in _run_sync)
            sender.close()


class _DaemonPool:
    """Threads for `def` handlers. Daemon threads: a handler still busy when the interpreter
    exits does not hold the exit up (concurrent.futures' pool would join it)."""

    def __init__(self, max_workers: int) -> None:
        self._q: "queue.SimpleQueue[Optional[tuple[Callable[..., None], tuple[Any, ...]]]]" = (
            queue.SimpleQueue()
        )
        self._max = max_workers
        self._threads = 0
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        # Each task takes an idle thread (reserved here) or starts one; past max_workers it
        # waits in the queue.
        with self._lock:
            spawn = False
            if self._idle > 0:
                self._idle -= 1
            elif self._threads < self._max:
                self._threads += 1
                spawn = True
        self._q.put((fn, args))
        if spawn:
            threading.Thread(target=self._work, name="topspin-handler", daemon=True).start()

    def _work(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, args = item
            fn(*args)
            with self._lock:
                self._idle += 1

    def shutdown(self) -> None:
        with self._lock:
            n = self._threads
        for _ in range(n):
            self._q.put(None)


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)


class ServerTls:
    """A server's TLS settings for `tls://` and `wss://` binds: its certificate chain
    (`cert_pem`, PEM file, leaf first) and private key (`key_pem`); with `client_ca_pem`
    every client must present a certificate that chains to one of its CAs (mutual TLS)."""

    def __init__(
        self,
        cert_pem: PathLike,
        key_pem: PathLike,
        *,
        client_ca_pem: Optional[PathLike] = None,
    ) -> None:
        self.cert_pem = cert_pem
        self.key_pem = key_pem
        self.client_ca_pem = client_ca_pem


class Server:
    """A server for generated servicers (`add_XServicer_to_server`) or `MethodHandler`s.

    `compression` ("zstd" or "gzip") compresses responses to clients that accept it;
    `tls` (a `ServerTls`) is needed to bind `tls://` and `wss://` addresses. Browser pages
    may open `ws://`/`wss://` calls only from the server's own origin unless
    `ws_allow_origins` (e.g. `["https://app.example.com", "http://localhost:*"]`) or
    `ws_allow_any_origin=True` (any page: only for servers whose calls carry their own
    credentials) say otherwise; clients that send no `Origin` are always accepted.

    `interceptors` (`topspin.ServerInterceptor`s, or `topspin.aio.ServerInterceptor`s: all of
    one sort) see every call before its handler, the first outermost.

    `memory_budget` (bytes; default: the process's, 1 GiB, shared by every server and channel
    that has none of its own) bounds what received messages hold: a request of 64 KiB or more
    is charged twice its size (its `bytes` and the message parsed from them) while its handler
    runs, and a call that finds no room is refused `RESOURCE_EXHAUSTED` before its handler.

    `add_health()` (`grpc.health.v1`) and `add_reflection()` (topspin's and gRPC's server
    reflection) add the Rust runtime's services, for grpcurl, gRPC health probes and the
    `topspin` command.

    `start(address)` serves from a thread of its own (its own asyncio loop for `async def`
    handlers; `def` handlers run on a thread pool of `max_workers`). Inside a running loop use
    `await start_async(address)`: the handlers then run on that loop.
    """

    def __init__(
        self,
        *,
        max_workers: int = 16,
        max_message_size: Optional[int] = None,
        compression: Optional[str] = None,
        tls: Optional[ServerTls] = None,
        ws_allow_origins: Optional[Sequence[str]] = None,
        ws_allow_any_origin: bool = False,
        interceptors: Optional[Sequence[Any]] = None,
        memory_budget: Optional[int] = None,
    ) -> None:
        self._memory_budget = memory_budget
        self._interceptors = tuple(interceptors or ())
        self._interceptors_async = False
        if self._interceptors:
            from ._server_interceptors import check

            self._interceptors_async = check(self._interceptors)
        self._ws_allow_origins = None if ws_allow_origins is None else list(ws_allow_origins)
        self._ws_allow_any_origin = ws_allow_any_origin
        self._methods: List[MethodHandler] = []
        self._async: List[bool] = []
        self._max_workers = max_workers
        self._max_message_size = max_message_size
        self._compression = compression
        self._tls = tls
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._own_loop = False
        self._thread: Optional[threading.Thread] = None
        self._pool: Optional[_DaemonPool] = None
        self._native: Optional[_native.Server] = None
        self._tasks: Dict[int, "asyncio.Task[None]"] = {}
        self._stopped = threading.Event()
        self._health: Optional[Health] = None
        self._reflection: Optional[List[str]] = None  # services to describe ([]: all)
        self.address: Optional[str] = None

    def add_method(self, handler: MethodHandler) -> None:
        if handler.kind not in KINDS:
            raise ValueError(f"unknown call kind {handler.kind!r}")
        self._methods.append(handler)
        self._async.append(_is_async(handler.handler))

    def add_health(self) -> Health:
        """Serves `grpc.health.v1.Health` (`Check`, `Watch`) and returns its status table
        (the same one on each call), where the whole server (`""`) starts `SERVING` and other
        services are unknown until set (`health.set_serving("kv.v1.Store")`). `stop` turns
        every service `NOT_SERVING`. The Rust runtime answers these calls, without the GIL
        (so the server's Python interceptors do not see them). Before `start`."""
        if self._native is not None:
            raise RuntimeError("the server was already started")
        if self._health is None:
            self._health = Health()
        return self._health

    def add_reflection(self, services: Optional[Sequence[str]] = None) -> None:
        """Serves server reflection: `topspin.reflection.v1` (the `topspin` command's `list`,
        `describe` and `call` with no `.proto` files) and gRPC's `grpc.reflection.v1` and
        `v1alpha` (`grpcurl list`, `describe`, calls with JSON). It describes `services`
        (full names, as grpcio's `enable_server_reflection`), by default every service with a
        method on this server when it starts, with `grpc.health.v1.Health` after
        `add_health()`, and reflection itself. Their `.proto` files come from protobuf's
        default descriptor pool, where the generated `_pb2` modules put them: a service not
        found there (methods added by hand) is not described, unless named in `services`,
        which raises ValueError. The Rust runtime answers these calls. Before `start`."""
        if self._native is not None:
            raise RuntimeError("the server was already started")
        names = list(services or ())
        if names:  # (checked now: the error is the caller's)
            from google.protobuf import descriptor_pool

            _reflection.file_descriptor_set(names, descriptor_pool.Default(), strict=True)
        self._reflection = names

    def _add_builtin_services(self, n: _native.Server) -> None:
        """Health and reflection, as asked for (after the methods: a clash is an error)."""
        owned = {_reflection.service_of(m.name) for m in self._methods}
        ours = set()
        if self._health is not None:
            ours.add(_health.SERVICE_NAME)
        if self._reflection is not None:
            ours.update(_reflection.SERVICE_NAMES)
        clash = sorted(owned & ours)
        if clash:
            raise ValueError(f"{', '.join(clash)} has methods of its own on this server")
        if self._health is not None:
            n.add_health(self._health._native)
        if self._reflection is not None:
            from google.protobuf import descriptor_pool

            names = self._reflection or sorted(owned)
            sets = [_reflection.file_descriptor_set(names, descriptor_pool.Default(), strict=False)]
            if self._health is not None:
                sets.append(_native.HEALTH_FILE_DESCRIPTOR_SET)
            n.add_reflection(sets)

    def _on_call(self, idx: int, call: _native.ServerCall) -> None:
        m = self._methods[idx]
        if self._interceptors:
            from ._server_interceptors import dispatch

            dispatch(self, m, call)
        elif self._async[idx]:
            assert self._loop is not None
            t = self._loop.create_task(_run_async(m, call, self._tasks))
            if not t.done():
                self._tasks[call.id] = t
        else:
            assert self._pool is not None
            self._pool.submit(_run_sync, m, call)

    def _on_cancel(self, call_id: int) -> None:
        t = self._tasks.pop(call_id, None)
        if t is not None:
            t.cancel()

    def _build(self, loop: asyncio.AbstractEventLoop, address: str) -> str:
        self._loop = loop
        self._pool = _DaemonPool(self._max_workers)
        c = completer(loop)
        tls = self._tls
        n = _native.Server(
            c,
            self._on_call,
            self._on_cancel,
            self._max_message_size,
            compression=self._compression,
            tls_cert_pem=None if tls is None else os.fspath(tls.cert_pem),
            tls_key_pem=None if tls is None else os.fspath(tls.key_pem),
            tls_client_ca_pem=(
                None if tls is None or tls.client_ca_pem is None else os.fspath(tls.client_ca_pem)
            ),
            ws_allow_origins=self._ws_allow_origins,
            ws_allow_any_origin=self._ws_allow_any_origin,
            memory_budget=self._memory_budget,
        )
        for m in self._methods:
            n.add_method(m.name, m.kind)
        self._add_builtin_services(n)
        self.address = n.start(address)
        self._native = n
        return self.address

    def start(self, address: str) -> str:
        """Binds (port 0 picks one) and serves; returns the address bound."""
        loop = asyncio.new_event_loop()
        ready: "concurrent.futures.Future[str]" = concurrent.futures.Future()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                ready.set_result(self._build(loop, address))
            except BaseException as e:  # noqa: BLE001
                ready.set_exception(e)
                return
            loop.run_forever()

        self._own_loop = True
        self._thread = threading.Thread(target=run, name="topspin-server", daemon=True)
        self._thread.start()
        return ready.result()

    async def start_async(self, address: str) -> str:
        """Binds and serves with handlers on the running loop; returns the address bound."""
        return self._build(asyncio.get_running_loop(), address)

    def stop(self, grace: float = 5.0) -> None:
        """Graceful shutdown: GOAWAY, calls in flight get `grace` seconds, the rest end."""
        if self._native is not None:
            self._native.stop(grace)
        self._finish()

    async def stop_async(self, grace: float = 5.0) -> None:
        if self._native is not None:
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            self._native.stop_async(completer(loop), fut, grace)
            await fut
        self._finish()

    def _finish(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        if self._own_loop and self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        self._stopped.set()

    def wait_for_termination(self, timeout: Optional[float] = None) -> bool:
        """Blocks until `stop()`; Ctrl-C interrupts it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stopped.wait(0.2):
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True
