"""Interceptors shaped as grpcio's: client (blocking `intercept_channel`, asyncio
`AsyncChannel(interceptors=...)`) and server (`Server(interceptors=...)`, `def` and
`async def`): chain order, metadata, rejection, wrapped streams, measuring; and a client
interceptor against the Rust kvstore server."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, List, Optional, Tuple

import kv_server
import pytest
from kv.v1 import kv_pb2, kv_topspin

import topspin
import topspin.aio
from topspin import Code, StatusError

Details = topspin.ClientCallDetails
Cont = Callable[[topspin.HandlerCallDetails], Optional[topspin.RpcMethodHandler]]
ACont = Callable[[topspin.HandlerCallDetails], Awaitable[Optional[topspin.RpcMethodHandler]]]
Seen = List[Tuple[Any, ...]]


def key() -> str:
    return "k-" + uuid.uuid4().hex[:8]


def _with_md(d: Details, k: str, v: str) -> Details:
    return d._replace(metadata=list(d.metadata or []) + [(k, v)])


# --- blocking client -----------------------------------------------------------------------


class Tag(
    topspin.UnaryUnaryClientInterceptor,
    topspin.UnaryStreamClientInterceptor,
    topspin.StreamUnaryClientInterceptor,
    topspin.StreamStreamClientInterceptor,
):
    """Adds the metadata `x-tag: name` and logs `name>` before and `<name` after."""

    def __init__(self, name: str, log: List[str]) -> None:
        self.name = name
        self.log = log

    def _go(self, continuation: Callable[[Details, Any], Any], d: Details, req: Any) -> Any:
        self.log.append(self.name + ">")
        out = continuation(_with_md(d, "x-tag", self.name), req)
        self.log.append("<" + self.name)
        return out

    def intercept_unary_unary(
        self, continuation: Any, client_call_details: Details, request: Any
    ) -> topspin.UnaryOutcome:
        out: topspin.UnaryOutcome = self._go(continuation, client_call_details, request)
        return out

    def intercept_unary_stream(
        self, continuation: Any, client_call_details: Details, request: Any
    ) -> Iterator[Any]:
        out: Iterator[Any] = self._go(continuation, client_call_details, request)
        return out

    def intercept_stream_unary(
        self, continuation: Any, client_call_details: Details, request_iterator: Any
    ) -> topspin.UnaryOutcome:
        out: topspin.UnaryOutcome = self._go(continuation, client_call_details, request_iterator)
        return out

    def intercept_stream_stream(
        self, continuation: Any, client_call_details: Details, request_iterator: Any
    ) -> Iterator[Any]:
        out: Iterator[Any] = self._go(continuation, client_call_details, request_iterator)
        return out


class Measure(topspin.UnaryUnaryClientInterceptor, topspin.UnaryStreamClientInterceptor):
    """Records (method, final code, seconds) of unary and server-streaming calls."""

    def __init__(self) -> None:
        self.seen: Seen = []

    def _record(self, method: str, t0: float) -> Callable[[Any], None]:
        return lambda call: self.seen.append((method, call.code(), time.monotonic() - t0))

    def intercept_unary_unary(
        self, continuation: Any, client_call_details: Details, request: Any
    ) -> topspin.UnaryOutcome:
        out: topspin.UnaryOutcome = continuation(client_call_details, request)
        out.add_done_callback(self._record(client_call_details.method, time.monotonic()))
        return out

    def intercept_unary_stream(
        self, continuation: Any, client_call_details: Details, request: Any
    ) -> Iterator[Any]:
        call: topspin.StreamCall = continuation(client_call_details, request)
        call.add_done_callback(self._record(client_call_details.method, time.monotonic()))
        return call


class Deny(topspin.UnaryUnaryClientInterceptor):
    def intercept_unary_unary(
        self, continuation: Any, client_call_details: Details, request: Any
    ) -> topspin.UnaryOutcome:
        raise StatusError(Code.PERMISSION_DENIED, "not from this client")


class Upper(topspin.UnaryStreamClientInterceptor):
    """Returns a generator of its own in place of the call: upper-cased values."""

    def intercept_unary_stream(
        self, continuation: Any, client_call_details: Details, request: Any
    ) -> Iterator[Any]:
        for ev in continuation(client_call_details, request):
            ev.put.value = ev.put.value.upper()
            yield ev


class SeeMetadata(topspin.ServerInterceptor):
    """Records (method, x-tag values) of every call."""

    def __init__(self) -> None:
        self.seen: Seen = []

    def intercept_service(
        self, continuation: Cont, handler_call_details: topspin.HandlerCallDetails
    ) -> Optional[topspin.RpcMethodHandler]:
        tags = [v for k, v in handler_call_details.invocation_metadata if k == "x-tag"]
        self.seen.append((handler_call_details.method, tags))
        return continuation(handler_call_details)


def _serve(servicer: Any, interceptors: Any = None) -> Tuple[topspin.Server, str]:
    server = topspin.Server(interceptors=interceptors)
    kv_topspin.add_StoreServicer_to_server(servicer, server)
    return server, server.start("tcp://127.0.0.1:0")


def test_sync_client_chain_order_and_metadata() -> None:
    see = SeeMetadata()
    server, addr = _serve(kv_server.SyncStore(kv_server.Store()), [see])
    log: List[str] = []
    ch = topspin.intercept_channel(topspin.Channel(addr), Tag("a", log), Tag("b", log))
    c = kv_topspin.StoreClient(ch)
    try:
        c.Put(kv_pb2.PutRequest(key="k", value="v"))
        assert log == ["a>", "b>", "<b", "<a"]
        assert [e.put.key for e in c.Watch(kv_pb2.WatchRequest(prefix=""))] == ["k"]
        assert c.Apply(iter([kv_pb2.Mutation(put=kv_pb2.PutRequest(key="j", value="w"))])).puts
        assert [e.value for e in c.GetMany(iter([kv_pb2.GetRequest(key="j")]))] == ["w"]
        methods = ["Put", "Watch", "Apply", "GetMany"]
        assert see.seen == [(f"/kv.v1.Store/{m}", ["a", "b"]) for m in methods]
        # A channel intercepted again: the new interceptor outermost.
        log.clear()
        kv_topspin.StoreClient(topspin.intercept_channel(ch, Tag("c", log))).Get(
            kv_pb2.GetRequest(key="k")
        )
        assert log == ["c>", "a>", "b>", "<b", "<a", "<c"]
        assert see.seen[-1] == ("/kv.v1.Store/Get", ["c", "a", "b"])
    finally:
        server.stop(1)


def test_sync_client_measure_reject_and_wrapped_stream() -> None:
    server, addr = _serve(kv_server.SyncStore(kv_server.Store()))
    m = Measure()
    c = kv_topspin.StoreClient(topspin.intercept_channel(topspin.Channel(addr), m))
    try:
        c.Put(kv_pb2.PutRequest(key="a", value="x"))
        with pytest.raises(StatusError) as ei:
            c.Get(kv_pb2.GetRequest(key="nope"))
        assert ei.value.code == Code.NOT_FOUND
        assert [ev.put.key for ev in c.Watch(kv_pb2.WatchRequest(prefix=""))] == ["a"]
        assert [(s[0], s[1]) for s in m.seen] == [
            ("/kv.v1.Store/Put", Code.OK),
            ("/kv.v1.Store/Get", Code.NOT_FOUND),
            ("/kv.v1.Store/Watch", Code.OK),
        ]
        assert all(s[2] >= 0 for s in m.seen)
        # Rejected before the call: the server never sees it.
        deny = kv_topspin.StoreClient(topspin.intercept_channel(topspin.Channel(addr), Deny()))
        with pytest.raises(StatusError) as ei:
            deny.Put(kv_pb2.PutRequest(key="b", value="y"))
        assert ei.value.code == Code.PERMISSION_DENIED
        with pytest.raises(StatusError):
            c.Get(kv_pb2.GetRequest(key="b"))
        up = kv_topspin.StoreClient(topspin.intercept_channel(topspin.Channel(addr), Upper()))
        assert [ev.put.value for ev in up.Watch(kv_pb2.WatchRequest(prefix=""))] == ["X"]
    finally:
        server.stop(1)


def test_interceptor_kinds_are_checked() -> None:
    with pytest.raises(TypeError):
        topspin.intercept_channel(topspin.Channel("tcp://127.0.0.1:1"), object())
    with pytest.raises(TypeError):
        topspin.AsyncChannel("tcp://127.0.0.1:1", interceptors=[Measure()])
    with pytest.raises(ValueError):
        topspin.Server(interceptors=[SeeMetadata(), AsyncAuth()])


# --- asyncio client ------------------------------------------------------------------------


class AsyncTag(
    topspin.aio.UnaryUnaryClientInterceptor,
    topspin.aio.UnaryStreamClientInterceptor,
    topspin.aio.StreamUnaryClientInterceptor,
    topspin.aio.StreamStreamClientInterceptor,
):
    def __init__(self, name: str, log: List[str]) -> None:
        self.name = name
        self.log = log

    async def _go(self, continuation: Any, d: Details, req: Any) -> Any:
        self.log.append(self.name + ">")
        out = await continuation(_with_md(d, "x-tag", self.name), req)
        self.log.append("<" + self.name)
        return out

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:  # noqa: E501
        return await self._go(continuation, client_call_details, request)

    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:  # noqa: E501
        return await self._go(continuation, client_call_details, request)

    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:  # noqa: E501
        return await self._go(continuation, client_call_details, request_iterator)

    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:  # noqa: E501
        return await self._go(continuation, client_call_details, request_iterator)


class AsyncMeasure(
    topspin.aio.UnaryUnaryClientInterceptor, topspin.aio.StreamStreamClientInterceptor
):
    """Unary: awaits the final code itself; bidirectional: a done callback."""

    def __init__(self) -> None:
        self.seen: Seen = []

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Details, request: Any
    ) -> topspin.aio.UnaryCall:
        t0 = time.monotonic()
        call: topspin.aio.UnaryCall = await continuation(client_call_details, request)
        code = await call.code()
        self.seen.append((client_call_details.method, code, time.monotonic() - t0))
        return call

    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: Details, request_iterator: Any
    ) -> topspin.aio.StreamCall:
        call: topspin.aio.StreamCall = await continuation(client_call_details, request_iterator)
        m = client_call_details.method
        call.add_done_callback(lambda c: self.seen.append((m, c.done(), 0.0)))
        return call


class AsyncUpper(topspin.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: Details, request: Any
    ) -> AsyncIterator[Any]:
        call = await continuation(client_call_details, request)

        async def gen() -> AsyncIterator[Any]:
            async for ev in call:
                ev.put.value = ev.put.value.upper()
                yield ev

        return gen()


class AsyncCached(topspin.aio.UnaryUnaryClientInterceptor):
    """Answers Get itself (a response in place of the call): the server never sees it."""

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Details, request: Any
    ) -> Any:
        if client_call_details.method.endswith("/Get"):
            return kv_pb2.Entry(key=request.key, value="cached")
        return await continuation(client_call_details, request)


def test_async_client_interceptors() -> None:
    async def main() -> None:
        see = SeeMetadata()
        server = topspin.Server(interceptors=[see])
        kv_topspin.add_StoreServicer_to_server(kv_server.AsyncStore(kv_server.Store()), server)
        addr = await server.start_async("tcp://127.0.0.1:0")
        log: List[str] = []
        m = AsyncMeasure()
        ch = topspin.AsyncChannel(addr, interceptors=[AsyncTag("a", log), AsyncTag("b", log), m])
        c = kv_topspin.StoreAsyncClient(ch)
        await c.Put(kv_pb2.PutRequest(key="k", value="v"))
        assert log == ["a>", "b>", "<b", "<a"]
        with pytest.raises(StatusError):
            await c.Get(kv_pb2.GetRequest(key="nope"))
        e, info = await c.Get.with_call(kv_pb2.GetRequest(key="k"))
        assert e.value == "v" and isinstance(info.trailers, list)
        assert [ev.put.key async for ev in c.Watch(kv_pb2.WatchRequest(prefix=""))] == ["k"]
        assert (await c.Apply([kv_pb2.Mutation(put=kv_pb2.PutRequest(key="j"))])).puts == 1
        assert [x.key async for x in c.GetMany([kv_pb2.GetRequest(key="j")])] == ["j"]
        methods = ["Put", "Get", "Get", "Watch", "Apply", "GetMany"]
        assert see.seen == [(f"/kv.v1.Store/{x}", ["a", "b"]) for x in methods]
        await asyncio.sleep(0)  # done callbacks run from the loop
        assert [(s[0], s[1]) for s in m.seen] == [
            ("/kv.v1.Store/Put", Code.OK),
            ("/kv.v1.Store/Get", Code.NOT_FOUND),
            ("/kv.v1.Store/Get", Code.OK),
            ("/kv.v1.Store/GetMany", True),
        ]
        up = kv_topspin.StoreAsyncClient(topspin.AsyncChannel(addr, interceptors=[AsyncUpper()]))
        assert [ev.put.value async for ev in up.Watch(kv_pb2.WatchRequest(prefix="k"))] == ["V"]
        n = len(see.seen)
        cached = kv_topspin.StoreAsyncClient(
            topspin.intercept_channel(topspin.AsyncChannel(addr), AsyncCached())
        )
        assert (await cached.Get(kv_pb2.GetRequest(key="zz"))).value == "cached"
        assert len(see.seen) == n
        await server.stop_async(1)

    asyncio.run(main())


class Hang(kv_topspin.StoreAsyncServicer):
    """Get and Watch wait until cancelled."""

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0

    async def _wait(self) -> None:
        self.started += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def Get(self, request: kv_pb2.GetRequest, context: topspin.ServicerContext) -> Any:
        await self._wait()

    async def Watch(
        self, request: kv_pb2.WatchRequest, context: topspin.ServicerContext
    ) -> AsyncIterator[kv_pb2.Event]:
        await self._wait()
        yield kv_pb2.Event()


def test_async_client_cancel_through_interceptors() -> None:
    """Cancelling the caller's task cancels the call an interceptor waits on."""

    async def until(cond: Callable[[], bool]) -> None:
        for _ in range(500):
            if cond():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("timed out")

    async def main() -> None:
        hang = Hang()
        server = topspin.Server()
        kv_topspin.add_StoreServicer_to_server(hang, server)
        addr = await server.start_async("tcp://127.0.0.1:0")
        ch = topspin.AsyncChannel(addr, interceptors=[AsyncMeasure(), AsyncUpper()])
        c = kv_topspin.StoreAsyncClient(ch)
        t = asyncio.ensure_future(c.Get(kv_pb2.GetRequest(key="a")))
        await until(lambda: hang.started == 1)
        t.cancel()
        await until(lambda: hang.cancelled == 1)
        w = c.Watch(kv_pb2.WatchRequest())
        t2 = asyncio.ensure_future(w.__anext__())
        await until(lambda: hang.started == 2)
        t2.cancel()
        await until(lambda: hang.cancelled == 2)
        await server.stop_async(1)

    asyncio.run(main())


# --- servers -------------------------------------------------------------------------------


def _deny(request: Any, context: topspin.ServicerContext) -> Any:
    context.abort(Code.UNAUTHENTICATED, "no token")


class Auth(topspin.ServerInterceptor):
    """Rejects calls without `authorization: ok` with a handler that aborts."""

    def intercept_service(
        self, continuation: Cont, handler_call_details: topspin.HandlerCallDetails
    ) -> Optional[topspin.RpcMethodHandler]:
        if ("authorization", "ok") not in handler_call_details.invocation_metadata:
            return topspin.unary_unary_rpc_method_handler(_deny)
        return continuation(handler_call_details)


class AsyncAuth(topspin.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: ACont,
        handler_call_details: topspin.HandlerCallDetails,
    ) -> Optional[topspin.RpcMethodHandler]:
        if ("authorization", "ok") not in handler_call_details.invocation_metadata:
            return topspin.unary_unary_rpc_method_handler(_deny)
        return await continuation(handler_call_details)


def _status_of(e: Optional[BaseException]) -> Code:
    return Code.OK if e is None else e.code if isinstance(e, StatusError) else Code.UNKNOWN


class Wrap(topspin.ServerInterceptor):
    """Wraps each handler: logs its name, times it with its final code, adds a trailer, and
    upper-cases the values of a server stream. `def` wrappers for `def` handlers, `async def`
    ones for `async def` handlers."""

    def __init__(self, name: str, log: List[str], use_async: bool) -> None:
        self.name, self.log, self.use_async = name, log, use_async
        self.seen: Seen = []

    def intercept_service(
        self, continuation: Cont, handler_call_details: topspin.HandlerCallDetails
    ) -> Optional[topspin.RpcMethodHandler]:
        self.log.append(self.name)
        return self.rewrap(continuation(handler_call_details), handler_call_details)

    def rewrap(
        self,
        h: Optional[topspin.RpcMethodHandler],
        handler_call_details: topspin.HandlerCallDetails,
    ) -> Optional[topspin.RpcMethodHandler]:
        assert h is not None
        m = handler_call_details.method
        if h.unary_unary is not None:
            return h._replace(unary_unary=self._unary(m, h.unary_unary))
        if h.unary_stream is not None:
            return h._replace(unary_stream=self._stream(m, h.unary_stream))
        return h

    def _end(self, method: str, t0: float, err: Optional[BaseException]) -> None:
        self.seen.append((method, _status_of(err), time.monotonic() - t0))

    def _unary(self, method: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def run(req: Any, ctx: topspin.ServicerContext) -> Any:
            t0, err = time.monotonic(), None
            self.log.append(self.name + "-handler")
            ctx.set_trailing_metadata([("x-by", self.name)])
            try:
                return inner(req, ctx)
            except BaseException as e:
                err = e
                raise
            finally:
                self._end(method, t0, err)

        async def run_async(req: Any, ctx: topspin.ServicerContext) -> Any:
            t0, err = time.monotonic(), None
            self.log.append(self.name + "-handler")
            ctx.set_trailing_metadata([("x-by", self.name)])
            try:
                return await inner(req, ctx)
            except BaseException as e:
                err = e
                raise
            finally:
                self._end(method, t0, err)

        return run_async if self.use_async else run

    def _stream(self, method: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def run(req: Any, ctx: topspin.ServicerContext) -> Iterator[Any]:
            t0 = time.monotonic()
            for ev in inner(req, ctx):
                ev.put.value = ev.put.value.upper()
                yield ev
            self._end(method, t0, None)

        async def run_async(req: Any, ctx: topspin.ServicerContext) -> AsyncIterator[Any]:
            t0 = time.monotonic()
            async for ev in inner(req, ctx):
                ev.put.value = ev.put.value.upper()
                yield ev
            self._end(method, t0, None)

        return run_async if self.use_async else run


class AsyncLog(topspin.aio.ServerInterceptor):
    def __init__(self, name: str, log: List[str]) -> None:
        self.name, self.log = name, log

    async def intercept_service(
        self,
        continuation: ACont,
        handler_call_details: topspin.HandlerCallDetails,
    ) -> Optional[topspin.RpcMethodHandler]:
        self.log.append(self.name)
        return await continuation(handler_call_details)


class AsyncWrap(topspin.aio.ServerInterceptor):
    """`Wrap` as an `async def` interceptor."""

    def __init__(self, w: Wrap) -> None:
        self.w = w

    async def intercept_service(
        self,
        continuation: ACont,
        handler_call_details: topspin.HandlerCallDetails,
    ) -> Optional[topspin.RpcMethodHandler]:
        self.w.log.append(self.w.name)
        return self.w.rewrap(await continuation(handler_call_details), handler_call_details)


class Counting(kv_server.SyncStore):
    """Counts the Get handler's runs."""

    calls = 0

    def Get(self, request: kv_pb2.GetRequest, context: topspin.ServicerContext) -> kv_pb2.Entry:
        Counting.calls += 1
        return super().Get(request, context)


class AsyncCounting(kv_server.AsyncStore):
    async def Get(
        self, request: kv_pb2.GetRequest, context: topspin.ServicerContext
    ) -> kv_pb2.Entry:
        Counting.calls += 1
        return await super().Get(request, context)


def _check_server(addr: str, log: List[str], want_log: List[str], wraps: List[Wrap]) -> None:
    ok = [("authorization", "ok")]
    c = kv_topspin.StoreClient(topspin.Channel(addr))
    c.Put(kv_pb2.PutRequest(key="a", value="x"), metadata=ok)
    assert log == want_log
    _, info = c.Get.with_call(kv_pb2.GetRequest(key="a"), metadata=ok)
    assert ("x-by", "b") in info.trailers
    with pytest.raises(StatusError) as ei:
        c.Get(kv_pb2.GetRequest(key="nope"), metadata=ok)
    assert ei.value.code == Code.NOT_FOUND
    assert [ev.put.value for ev in c.Watch(kv_pb2.WatchRequest(prefix=""), metadata=ok)] == ["X"]
    for w in wraps:
        assert [(s[0], s[1]) for s in w.seen] == [
            ("/kv.v1.Store/Put", Code.OK),
            ("/kv.v1.Store/Get", Code.OK),
            ("/kv.v1.Store/Get", Code.NOT_FOUND),
            ("/kv.v1.Store/Watch", Code.OK),
        ]
    # Rejected before the handler, unary and streaming methods alike.
    before = Counting.calls
    for call in (
        lambda: c.Get(kv_pb2.GetRequest(key="a")),
        lambda: list(c.Watch(kv_pb2.WatchRequest(prefix=""))),
        lambda: c.Apply(iter([])),
    ):
        with pytest.raises(StatusError) as ei:
            call()
        assert (ei.value.code, ei.value.message) == (Code.UNAUTHENTICATED, "no token")
    assert Counting.calls == before


def test_sync_server_interceptors() -> None:
    log: List[str] = []
    wa, wb = Wrap("a", log, False), Wrap("b", log, False)
    Counting.calls = 0
    server, addr = _serve(Counting(kv_server.Store()), [Auth(), wa, wb])
    try:
        _check_server(addr, log, ["a", "b", "a-handler", "b-handler"], [wa, wb])
        assert Counting.calls == 2
    finally:
        server.stop(1)


def test_async_server_interceptors() -> None:
    async def main() -> None:
        log: List[str] = []
        wb = Wrap("b", log, True)
        server = topspin.Server(interceptors=[AsyncAuth(), AsyncLog("a", log), AsyncWrap(wb)])
        kv_topspin.add_StoreServicer_to_server(AsyncCounting(kv_server.Store()), server)
        addr = await server.start_async("tcp://127.0.0.1:0")
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, _check_server, addr, log, ["a", "b", "b-handler"], [wb]
            )
            assert Counting.calls == 2
        finally:
            await server.stop_async(1)

    Counting.calls = 0
    asyncio.run(main())


def test_server_interceptor_failures() -> None:
    class Boom(topspin.ServerInterceptor):
        def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
            if handler_call_details.method.endswith("/Put"):
                raise StatusError(Code.RESOURCE_EXHAUSTED, "slow down")
            if handler_call_details.method.endswith("/Delete"):
                return None
            raise RuntimeError("bug")

    server, addr = _serve(kv_server.SyncStore(kv_server.Store()), [Boom()])
    c = kv_topspin.StoreClient(topspin.Channel(addr))
    try:
        for call, code in (
            (lambda: c.Put(kv_pb2.PutRequest(key="a")), Code.RESOURCE_EXHAUSTED),
            (lambda: c.Delete(kv_pb2.DeleteRequest(key="a")), Code.UNIMPLEMENTED),
            (lambda: c.Get(kv_pb2.GetRequest(key="a")), Code.INTERNAL),
        ):
            with pytest.raises(StatusError) as ei:
                call()
            assert ei.value.code == code
    finally:
        server.stop(1)


# --- against the Rust kvstore server -------------------------------------------------------


def test_client_interceptors_against_rust_server(kv_server: str) -> None:
    m = Measure()
    log: List[str] = []
    c = kv_topspin.StoreClient(
        topspin.intercept_channel(topspin.Channel(kv_server), Tag("a", log), m)
    )
    k = key()
    c.Put(kv_pb2.PutRequest(key=k, value="v"), timeout=5)
    with pytest.raises(StatusError):
        c.Get(kv_pb2.GetRequest(key=k + "-absent"))
    w = c.Watch(kv_pb2.WatchRequest(prefix=k, include_existing=True), timeout=5)
    assert next(w).put.key == k
    w.cancel()
    assert log == ["a>", "<a"] * 3
    assert [(s[0], s[1]) for s in m.seen] == [
        ("/kv.v1.Store/Put", Code.OK),
        ("/kv.v1.Store/Get", Code.NOT_FOUND),
        ("/kv.v1.Store/Watch", Code.CANCELLED),
    ]

    async def main() -> None:
        am = AsyncMeasure()
        ac = kv_topspin.StoreAsyncClient(topspin.AsyncChannel(kv_server, interceptors=[am]))
        assert (await ac.Get(kv_pb2.GetRequest(key=k))).value == "v"
        assert [(s[0], s[1]) for s in am.seen] == [("/kv.v1.Store/Get", Code.OK)]

    asyncio.run(main())
