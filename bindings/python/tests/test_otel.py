"""OpenTelemetry (`topspin.otel`): client and server spans in one trace, the handler inside the
server span, error status, streaming calls, blocking and asyncio, a raw `traceparent` continued,
and the duration histograms; with the SDK's in-memory exporter and metric reader."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, AsyncIterator, Iterable, Iterator, List, NamedTuple, Optional

import kv_server
import pytest
from kv.v1 import kv_pb2, kv_topspin

import topspin

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanContext, SpanKind, StatusCode  # noqa: E402

import topspin.otel  # noqa: E402


class Otel(NamedTuple):
    tp: TracerProvider
    mp: MeterProvider
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader


@pytest.fixture
def otel() -> Iterator[Otel]:
    spans = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    yield Otel(tp, mp, spans, reader)
    tp.shutdown()
    mp.shutdown()


def key() -> str:
    return "k-" + uuid.uuid4().hex[:8]


def finished(o: Otel, n: int) -> List[ReadableSpan]:
    """The first `n` finished spans (a server's span may end just after the client's call)."""
    deadline = time.monotonic() + 5
    while True:
        got = list(o.spans.get_finished_spans())
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.01)


def one(spans: List[ReadableSpan], name: str, kind: SpanKind) -> ReadableSpan:
    found = [s for s in spans if s.name == name and s.kind == kind]
    assert len(found) == 1, [(s.name, s.kind) for s in spans]
    return found[0]


def ctx(s: ReadableSpan) -> SpanContext:
    c: Optional[SpanContext] = s.context
    assert c is not None
    return c


def check_pair(
    spans: List[ReadableSpan], method: str, code: int, parent: Optional[SpanContext]
) -> SpanContext:
    """The client and server span of one call; returns the server span's context."""
    c = one(spans, f"kv.v1.Store/{method}", SpanKind.CLIENT)
    s = one(spans, f"kv.v1.Store/{method}", SpanKind.SERVER)
    assert ctx(s).trace_id == ctx(c).trace_id
    assert s.parent is not None and s.parent.span_id == ctx(c).span_id
    assert s.parent.is_remote
    if parent is None:
        assert c.parent is None
    else:
        assert c.parent is not None and c.parent.span_id == parent.span_id
        assert ctx(c).trace_id == parent.trace_id
    for x in (c, s):
        assert x.attributes is not None
        assert dict(x.attributes) == {
            "rpc.system": "topspin",
            "rpc.service": "kv.v1.Store",
            "rpc.method": method,
            "rpc.grpc.status_code": code,
        }
        assert x.status.status_code == (StatusCode.UNSET if code == 0 else StatusCode.ERROR)
    return ctx(s)


Seen = List[SpanContext]


def current() -> SpanContext:
    return trace.get_current_span().get_span_context()


class SyncStore(kv_server.SyncStore):
    """Notes the current span in each handler (in its body, and between stream messages)."""

    def __init__(self, seen: Seen) -> None:
        super().__init__(kv_server.Store())
        self.seen = seen

    def Get(self, request: kv_pb2.GetRequest, context: topspin.ServicerContext) -> kv_pb2.Entry:
        self.seen.append(current())
        return super().Get(request, context)

    def Watch(
        self, request: kv_pb2.WatchRequest, context: topspin.ServicerContext
    ) -> Iterable[kv_pb2.Event]:
        for e in super().Watch(request, context):
            self.seen.append(current())
            yield e

    def GetMany(
        self, request: Iterator[kv_pb2.GetRequest], context: topspin.ServicerContext
    ) -> Iterable[kv_pb2.Entry]:
        for r in request:
            self.seen.append(current())
            yield self.store.get(r.key)


class AsyncStore(kv_server.AsyncStore):
    def __init__(self, seen: Seen) -> None:
        super().__init__(kv_server.Store())
        self.seen = seen

    async def Get(
        self, request: kv_pb2.GetRequest, context: topspin.ServicerContext
    ) -> kv_pb2.Entry:
        await asyncio.sleep(0)
        self.seen.append(current())
        return self.store.get(request.key)

    async def Watch(
        self, request: kv_pb2.WatchRequest, context: topspin.ServicerContext
    ) -> AsyncIterator[kv_pb2.Event]:
        for e in self.store.snapshot(request.prefix):
            await asyncio.sleep(0)
            self.seen.append(current())
            yield kv_pb2.Event(put=e)

    async def GetMany(
        self, request: AsyncIterator[kv_pb2.GetRequest], context: topspin.ServicerContext
    ) -> AsyncIterator[kv_pb2.Entry]:
        async for r in request:
            self.seen.append(current())
            yield self.store.get(r.key)


def serve(servicer: Any, interceptor: Any) -> tuple[topspin.Server, str]:
    server = topspin.Server(interceptors=[interceptor])
    kv_topspin.add_StoreServicer_to_server(servicer, server)
    return server, server.start("tcp://127.0.0.1:0")


def test_blocking_unary_one_trace_and_error(otel: Otel) -> None:
    seen: Seen = []
    server, addr = serve(SyncStore(seen), topspin.otel.server_interceptor(otel.tp, otel.mp))
    try:
        ch = topspin.intercept_channel(
            topspin.Channel(addr), topspin.otel.client_interceptor(otel.tp, otel.mp)
        )
        store = kv_topspin.StoreClient(ch)
        k = key()
        with otel.tp.get_tracer("test").start_as_current_span("root") as root:
            store.Put(kv_pb2.PutRequest(key=k, value="v"), timeout=5)
            assert store.Get(kv_pb2.GetRequest(key=k), timeout=5).value == "v"
        spans = finished(otel, 5)
        root_ctx = root.get_span_context()
        check_pair(spans, "Put", 0, root_ctx)
        assert seen == [check_pair(spans, "Get", 0, root_ctx)]  # the handler ran in its span

        # A failed call, with no span current: a trace of its own; ERROR on both sides.
        otel.spans.clear()
        with pytest.raises(topspin.StatusError) as e:
            store.Get(kv_pb2.GetRequest(key="missing"), timeout=5)
        assert e.value.code == topspin.Code.NOT_FOUND
        spans = finished(otel, 2)
        check_pair(spans, "Get", int(topspin.Code.NOT_FOUND), None)
        for s in spans:
            assert s.status.description is not None and "NOT_FOUND" in s.status.description
    finally:
        server.stop(grace=1)


def test_blocking_streams(otel: Otel) -> None:
    seen: Seen = []
    server, addr = serve(SyncStore(seen), topspin.otel.server_interceptor(otel.tp, otel.mp))
    try:
        ch = topspin.intercept_channel(
            topspin.Channel(addr), topspin.otel.client_interceptor(otel.tp, otel.mp)
        )
        store = kv_topspin.StoreClient(ch)
        p = key()
        s = store.Apply(
            iter([kv_pb2.Mutation(put=kv_pb2.PutRequest(key=f"{p}/{i}")) for i in (1, 2)])
        )
        assert s.puts == 2
        otel.spans.clear()
        with otel.tp.get_tracer("test").start_as_current_span("root") as root:
            events = list(store.Watch(kv_pb2.WatchRequest(prefix=p), timeout=5))
            assert len(events) == 2
            gets = [kv_pb2.GetRequest(key=f"{p}/{i}") for i in (1, 2)]
            assert [e.key for e in store.GetMany(iter(gets), timeout=5)] == [f"{p}/1", f"{p}/2"]
        spans = finished(otel, 5)
        watch = check_pair(spans, "Watch", 0, root.get_span_context())
        many = check_pair(spans, "GetMany", 0, root.get_span_context())
        assert seen == [watch, watch, many, many]

        # A stream the server fails: ERROR on both sides once the client has read its end.
        otel.spans.clear()
        with pytest.raises(topspin.StatusError):
            list(store.GetMany(iter([kv_pb2.GetRequest(key="missing")]), timeout=5))
        check_pair(finished(otel, 2), "GetMany", int(topspin.Code.NOT_FOUND), None)
    finally:
        server.stop(grace=1)


def test_handler_exception_is_internal_with_event(otel: Otel) -> None:
    class Broken(kv_server.SyncStore):
        def Get(self, request: kv_pb2.GetRequest, context: topspin.ServicerContext) -> Any:
            raise ValueError("boom")

    server, addr = serve(
        Broken(kv_server.Store()), topspin.otel.server_interceptor(otel.tp, otel.mp)
    )
    try:
        with pytest.raises(topspin.StatusError) as e:
            kv_topspin.StoreClient(topspin.Channel(addr)).Get(kv_pb2.GetRequest(key="a"))
        assert e.value.code == topspin.Code.INTERNAL
        (s,) = finished(otel, 1)
        assert s.kind == SpanKind.SERVER and s.status.status_code == StatusCode.ERROR
        assert s.attributes is not None and s.attributes["rpc.grpc.status_code"] == 13
        assert [ev.name for ev in s.events] == ["exception"]
    finally:
        server.stop(grace=1)


@pytest.mark.parametrize("server_side", ["def", "async def"])
def test_asyncio(otel: Otel, server_side: str) -> None:
    """asyncio client; `async def` handlers behind the `def` or the `async def` interceptor."""
    seen: Seen = []
    if server_side == "def":
        interceptor: Any = topspin.otel.server_interceptor(otel.tp, otel.mp)
    else:
        interceptor = topspin.otel.aio_server_interceptor(otel.tp, otel.mp)
    server, addr = serve(AsyncStore(seen), interceptor)
    tracer = otel.tp.get_tracer("test")

    async def main() -> SpanContext:
        ch = topspin.AsyncChannel(
            addr, interceptors=topspin.otel.aio_client_interceptors(otel.tp, otel.mp)
        )
        store = kv_topspin.StoreAsyncClient(ch)
        p = key()
        with tracer.start_as_current_span("root") as root:
            await store.Put(kv_pb2.PutRequest(key=f"{p}/1", value="v"), timeout=5)
            assert (await store.Get(kv_pb2.GetRequest(key=f"{p}/1"), timeout=5)).value == "v"
            with pytest.raises(topspin.StatusError):
                await store.Get(kv_pb2.GetRequest(key="missing"), timeout=5)
            assert len([e async for e in store.Watch(kv_pb2.WatchRequest(prefix=p))]) == 1
            gets = [kv_pb2.GetRequest(key=f"{p}/1")] * 2
            assert len([e async for e in store.GetMany(gets, timeout=5)]) == 2
        return root.get_span_context()

    try:
        root = asyncio.run(main())
        spans = finished(otel, 11)
        by_kind = sorted((s.name, s.kind.name) for s in spans)
        assert len(spans) == 11, by_kind  # root, and two per call
        check_pair(spans, "Put", 0, root)
        get_ok = [s for s in spans if s.name.endswith("/Get") and s.status.is_ok]
        get_err = [s for s in spans if s.name.endswith("/Get") and not s.status.is_ok]
        ok = check_pair(get_ok, "Get", 0, root)
        err = check_pair(get_err, "Get", int(topspin.Code.NOT_FOUND), root)
        watch = check_pair(spans, "Watch", 0, root)
        many = check_pair(spans, "GetMany", 0, root)
        assert seen == [ok, err, watch, many, many]
    finally:
        server.stop(grace=1)


def test_raw_traceparent_is_continued(otel: Otel) -> None:
    """A `traceparent` written by hand (any W3C client) is the server span's parent."""
    seen: Seen = []
    server, addr = serve(SyncStore(seen), topspin.otel.server_interceptor(otel.tp, otel.mp))
    try:
        trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        store = kv_topspin.StoreClient(topspin.Channel(addr))  # no client instrumentation
        with pytest.raises(topspin.StatusError):
            store.Get(
                kv_pb2.GetRequest(key="a"),
                metadata=[("traceparent", f"00-{trace_id}-{span_id}-01")],
                timeout=5,
            )
        (s,) = finished(otel, 1)
        assert format(ctx(s).trace_id, "032x") == trace_id
        assert s.parent is not None and format(s.parent.span_id, "016x") == span_id
        assert seen == [ctx(s)]
    finally:
        server.stop(grace=1)


def test_duration_histograms(otel: Otel) -> None:
    server, addr = serve(SyncStore([]), topspin.otel.server_interceptor(otel.tp, otel.mp))
    try:
        ch = topspin.intercept_channel(
            topspin.Channel(addr), topspin.otel.client_interceptor(otel.tp, otel.mp)
        )
        store = kv_topspin.StoreClient(ch)
        k = key()
        store.Put(kv_pb2.PutRequest(key=k, value="v"), timeout=5)
        for _ in range(3):
            store.Get(kv_pb2.GetRequest(key=k), timeout=5)
        with pytest.raises(topspin.StatusError):
            store.Get(kv_pb2.GetRequest(key="missing"), timeout=5)
        finished(otel, 10)  # every server span ended, so every server measurement is made
        data = otel.metrics.get_metrics_data()
        assert data is not None
        points = {}
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    assert m.unit == "ms"
                    for dp in m.data.data_points:
                        attrs = dict(dp.attributes or {})
                        points[(m.name, attrs["rpc.method"], attrs["rpc.grpc.status_code"])] = dp
        for side in ("client", "server"):
            name = f"rpc.{side}.duration"
            assert points[(name, "Get", 0)].count == 3  # type: ignore[union-attr]
            assert points[(name, "Get", 5)].count == 1  # type: ignore[union-attr]
            assert points[(name, "Put", 0)].count == 1  # type: ignore[union-attr]
            dp = points[(name, "Get", 0)]
            assert dict(dp.attributes or {})["rpc.system"] == "topspin"
            assert dict(dp.attributes or {})["rpc.service"] == "kv.v1.Store"
    finally:
        server.stop(grace=1)
