"""Python servers (def and async def handlers): Rust clients (kvstore-client, the topspin CLI)
and Python clients against them, every call kind, TCP and Unix sockets."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import tempfile
import threading
import time
from typing import Any, AsyncIterator, Iterator

import kv_server
import pytest
from conftest import KV_PROTO_DIR, binary, ws_upgrade_status
from kv.v1 import kv_pb2, kv_topspin

import topspin


@pytest.fixture(params=["sync-tcp", "sync-unix", "async-tcp", "async-unix"])
def py_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """The Python kv server; its handlers `def` or `async def`."""
    kind, transport = request.param.split("-")
    with tempfile.TemporaryDirectory() as d:
        addr = "tcp://127.0.0.1:0" if transport == "tcp" else f"unix://{d}/kv.sock"
        server = topspin.Server()
        store = kv_server.Store()
        if kind == "sync":
            kv_topspin.add_StoreServicer_to_server(kv_server.SyncStore(store), server)
        else:
            kv_topspin.add_StoreServicer_to_server(kv_server.AsyncStore(store), server)
        bound = server.start(addr)
        try:
            yield bound if transport == "tcp" else addr
        finally:
            server.stop(1)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60)


def test_rust_kvstore_client(py_server: str) -> None:
    cli = binary("kvstore-client")
    r = run(cli, py_server, "put", "a", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "version 1"
    r = run(cli, py_server, "get", "a")
    assert r.stdout.strip() == "a = 1 (version 1)", r.stderr
    r = run(cli, py_server, "get", "zz")
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr and "zz" in r.stderr
    r = run(cli, py_server, "apply", "b=2", "c=3")
    assert r.stdout.strip() == "2 puts, 0 deletes", r.stderr
    r = run(cli, py_server, "get-many", "a", "b", "c")
    assert r.stdout.splitlines() == ["a = 1 (version 1)", "b = 2 (version 1)", "c = 3 (version 1)"]
    r = run(cli, py_server, "delete", "a")
    assert r.stdout.strip() == "deleted", r.stderr
    # Watch streams the existing entries, then this server ends the stream.
    r = run(cli, py_server, "watch", "")
    assert r.stdout.splitlines() == ["put b = 2 (version 1)", "put c = 3 (version 1)"], r.stderr


def test_topspin_cli(py_server: str) -> None:
    cli = binary("topspin")
    proto = ["--proto", "kv/v1/kv.proto", "-I", KV_PROTO_DIR]
    r = run(cli, "call", *proto, py_server, "kv.v1.Store/Put", "-d", '{"key": "k", "value": "v"}')
    assert r.returncode == 0, r.stderr
    r = run(cli, "call", *proto, py_server, "kv.v1.Store/Get", "-d", '{"key": "k"}')
    assert json.loads(r.stdout)["value"] == "v", r.stderr
    r = run(cli, "call", *proto, py_server, "kv.v1.Store/Get", "-d", '{"key": "nope"}')
    assert r.returncode == 64 + 5, r.stderr
    r = run(
        cli, "call", *proto, py_server, "kv.v1.Store/GetMany", "-d", '{"key": "k"} {"key": "k"}'
    )
    assert [json.loads(x)["key"] for x in r.stdout.splitlines()] == ["k", "k"], r.stderr


def test_python_client(py_server: str) -> None:
    c = kv_topspin.StoreClient(topspin.Channel(py_server))
    assert c.Put(kv_pb2.PutRequest(key="x", value="1")).version == 1
    s = c.Apply(kv_pb2.Mutation(put=kv_pb2.PutRequest(key=f"m{i}")) for i in range(30))
    assert s.puts == 30
    assert [e.put.key for e in c.Watch(kv_pb2.WatchRequest(prefix="m"))] == sorted(
        f"m{i}" for i in range(30)
    )
    assert [e.key for e in c.GetMany(kv_pb2.GetRequest(key=f"m{i}") for i in range(30))] == [
        f"m{i}" for i in range(30)
    ]

    async def main() -> None:
        a = kv_topspin.StoreAsyncClient(topspin.AsyncChannel(py_server))
        rs = await asyncio.gather(*(a.Get(kv_pb2.GetRequest(key=f"m{i}")) for i in range(30)))
        assert [r.key for r in rs] == [f"m{i}" for i in range(30)]
        with pytest.raises(topspin.StatusError) as ei:
            await a.Get(kv_pb2.GetRequest(key="absent"))
        assert ei.value.code == topspin.Code.NOT_FOUND

    asyncio.run(main())


# --- behaviour of handlers -------------------------------------------------------------------


class Probe(kv_topspin.StoreServicer):
    """Handlers that report what they see."""

    def __init__(self) -> None:
        self.seen: dict[str, object] = {}
        self.cancelled = threading.Event()

    def Get(self, request: kv_pb2.GetRequest, context: topspin.ServicerContext) -> kv_pb2.Entry:
        if request.key == "boom":
            raise ValueError("kaput")
        if request.key == "abort":
            context.set_trailing_metadata([("why", "because"), ("blob-bin", b"\x01\x02")])
            context.abort(topspin.Code.PERMISSION_DENIED, "no", b"\x08\x01")
        if request.key == "slow":
            while not context.is_cancelled():
                time.sleep(0.01)
            self.cancelled.set()
            return kv_pb2.Entry()
        self.seen["metadata"] = context.invocation_metadata()
        self.seen["peer"] = context.peer()
        self.seen["remaining"] = context.time_remaining()
        context.set_initial_metadata([("h", "1")])
        context.set_trailing_metadata([("t", "2")])
        return kv_pb2.Entry(key=request.key, value="ok")


class AsyncProbe(kv_topspin.StoreAsyncServicer):
    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.started = threading.Event()

    async def Get(
        self, request: kv_pb2.GetRequest, context: topspin.ServicerContext
    ) -> kv_pb2.Entry:
        if request.key == "boom":
            raise RuntimeError("async kaput")
        self.started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return kv_pb2.Entry()

    async def Watch(  # type: ignore[override]
        self, request: kv_pb2.WatchRequest, context: topspin.ServicerContext
    ) -> AsyncIterator[kv_pb2.Event]:
        for i in range(3):
            yield kv_pb2.Event(deleted=str(i))
        raise topspin.StatusError(topspin.Code.ABORTED, "after three")


def test_handler_sees_call_and_errors_end_only_their_call() -> None:
    probe = Probe()
    server = topspin.Server()
    kv_topspin.add_StoreServicer_to_server(probe, server)
    addr = server.start("tcp://127.0.0.1:0")
    try:
        c = kv_topspin.StoreClient(topspin.Channel(addr))
        with pytest.raises(topspin.StatusError) as ei:
            c.Get(kv_pb2.GetRequest(key="boom"))
        assert ei.value.code == topspin.Code.INTERNAL and "kaput" in ei.value.message
        with pytest.raises(topspin.StatusError) as ei:
            c.Get(kv_pb2.GetRequest(key="abort"))
        assert ei.value.code == topspin.Code.PERMISSION_DENIED
        assert ei.value.details == b"\x08\x01"
        assert ("why", "because") in ei.value.trailers
        assert ("blob-bin", b"\x01\x02") in ei.value.trailers
        e, info = c.Get.with_call(
            kv_pb2.GetRequest(key="a"), timeout=10, metadata=[("user", "ann"), ("k-bin", b"\xff")]
        )
        assert e.value == "ok"
        assert ("h", "1") in info.headers and ("t", "2") in info.trailers
        md = probe.seen["metadata"]
        assert isinstance(md, list) and ("user", "ann") in md and ("k-bin", b"\xff") in md
        assert str(probe.seen["peer"]).startswith("127.0.0.1:")
        rem = probe.seen["remaining"]
        assert isinstance(rem, float) and 0 < rem <= 10
        # A deadline cancels the handler's call; it sees it.
        with pytest.raises(topspin.StatusError) as ei:
            c.Get(kv_pb2.GetRequest(key="slow"), timeout=0.3)
        assert ei.value.code == topspin.Code.DEADLINE_EXCEEDED
        assert probe.cancelled.wait(10)
        # The server goes on.
        assert c.Get(kv_pb2.GetRequest(key="b")).key == "b"
    finally:
        server.stop(1)


def test_async_handler_cancelled_and_stream_error() -> None:
    probe = AsyncProbe()

    async def main() -> None:
        server = topspin.Server()
        kv_topspin.add_StoreServicer_to_server(probe, server)
        with tempfile.TemporaryDirectory() as d:
            addr = await server.start_async(f"unix://{d}/s.sock")
            c = kv_topspin.StoreAsyncClient(topspin.AsyncChannel(addr))
            with pytest.raises(topspin.StatusError) as ei:
                await c.Get(kv_pb2.GetRequest(key="boom"))
            assert ei.value.code == topspin.Code.INTERNAL
            # Cancelling the client's task cancels the handler's task.
            t = asyncio.ensure_future(c.Get(kv_pb2.GetRequest(key="wait")))
            while not probe.started.is_set():
                await asyncio.sleep(0.01)
            t.cancel()
            for _ in range(500):
                if probe.cancelled.is_set():
                    break
                await asyncio.sleep(0.01)
            assert probe.cancelled.is_set()
            got = []
            with pytest.raises(topspin.StatusError) as ei:
                async for ev in c.Watch(kv_pb2.WatchRequest()):
                    got.append(ev.deleted)
            assert got == ["0", "1", "2"]
            assert ei.value.code == topspin.Code.ABORTED
            # Unimplemented methods of the base class answer UNIMPLEMENTED.
            with pytest.raises(topspin.StatusError) as ei:
                await c.Put(kv_pb2.PutRequest(key="a"))
            assert ei.value.code == topspin.Code.UNIMPLEMENTED
            await server.stop_async(1)
            assert not os.path.exists(f"{d}/s.sock")

    asyncio.run(main())


def test_graceful_shutdown_lets_calls_finish() -> None:
    class Slow(kv_topspin.StoreServicer):
        def Get(self, request: kv_pb2.GetRequest, context: topspin.ServicerContext) -> kv_pb2.Entry:
            time.sleep(0.3)
            return kv_pb2.Entry(key=request.key)

    server = topspin.Server()
    kv_topspin.add_StoreServicer_to_server(Slow(), server)
    addr = server.start("tcp://127.0.0.1:0")
    c = kv_topspin.StoreClient(topspin.Channel(addr))
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(c.Get(kv_pb2.GetRequest(key="q"))))
    t.start()
    time.sleep(0.1)
    server.stop(5)
    t.join(10)
    assert len(out) == 1 and out[0].key == "q"
    with pytest.raises(topspin.StatusError) as ei:
        c.Get(kv_pb2.GetRequest(key="after"), timeout=2)
    assert ei.value.code == topspin.Code.UNAVAILABLE


def test_client_hang_up_stops_a_streaming_handler() -> None:
    stopped = threading.Event()

    class Endless(kv_topspin.StoreServicer):
        def Watch(
            self, request: kv_pb2.WatchRequest, context: topspin.ServicerContext
        ) -> Iterator[kv_pb2.Event]:
            try:
                i = 0
                while i < 1_000_000:  # bounded: ends on its own after a while
                    yield kv_pb2.Event(deleted=str(i))
                    i += 1
            finally:
                stopped.set()

    server = topspin.Server()
    kv_topspin.add_StoreServicer_to_server(Endless(), server)
    addr = server.start("tcp://127.0.0.1:0")
    try:
        c = kv_topspin.StoreClient(topspin.Channel(addr))
        w = c.Watch(kv_pb2.WatchRequest())
        assert [next(w).deleted for _ in range(3)] == ["0", "1", "2"]
        w.cancel()
        assert stopped.wait(10)
    finally:
        server.stop(1)


def test_failing_request_iterator_cancels_the_call(kv_server: str) -> None:
    c = kv_topspin.StoreClient(topspin.Channel(kv_server))

    def muts() -> Iterator[kv_pb2.Mutation]:
        yield kv_pb2.Mutation(put=kv_pb2.PutRequest(key="half", value="1"))
        raise ValueError("no more")

    with pytest.raises(ValueError, match="no more"):
        c.Apply(muts())
    # The exception reached the caller (the call was cancelled, not half-closed); the channel
    # goes on.
    assert c.Put(kv_pb2.PutRequest(key="after", value="2")).version >= 1


def test_streaming_handler_headers() -> None:
    class Headed(kv_topspin.StoreAsyncServicer):
        async def Watch(
            self, request: kv_pb2.WatchRequest, context: topspin.ServicerContext
        ) -> AsyncIterator[kv_pb2.Event]:
            context.set_initial_metadata([("stream-h", "yes")])
            yield kv_pb2.Event(deleted="x")

    server = topspin.Server()
    kv_topspin.add_StoreServicer_to_server(Headed(), server)
    addr = server.start("tcp://127.0.0.1:0")
    try:
        w = kv_topspin.StoreClient(topspin.Channel(addr)).Watch(kv_pb2.WatchRequest())
        assert [e.deleted for e in w] == ["x"]
        assert ("stream-h", "yes") in (w.headers() or [])
    finally:
        server.stop(1)


def test_a_failing_call_carries_its_response_headers() -> None:
    """protocol.md §5.4: a handler that set its headers (or put them on its error) and then
    failed sends them before the error, and the client keeps them on its StatusError."""

    class Failing(kv_topspin.StoreServicer):
        def Get(self, request: kv_pb2.GetRequest, context: topspin.ServicerContext) -> kv_pb2.Entry:
            context.set_initial_metadata([("set-h", "1")])
            if request.key == "plain":
                raise topspin.StatusError(topspin.Code.NOT_FOUND, "plain")
            raise topspin.StatusError(
                topspin.Code.NOT_FOUND, "with headers", headers=[("err-h", "2")]
            )

    server = topspin.Server()
    kv_topspin.add_StoreServicer_to_server(Failing(), server)
    addr = server.start("tcp://127.0.0.1:0")
    try:
        c = kv_topspin.StoreClient(topspin.Channel(addr))
        with pytest.raises(topspin.StatusError) as ei:
            c.Get(kv_pb2.GetRequest(key="k"))
        assert ei.value.code == topspin.Code.NOT_FOUND
        assert ei.value.headers == [("set-h", "1"), ("err-h", "2")]
        with pytest.raises(topspin.StatusError) as ei:
            c.Get(kv_pb2.GetRequest(key="plain"))
        assert ei.value.headers == [("set-h", "1")]
    finally:
        server.stop(1)


def test_blocking_handlers_run_concurrently() -> None:
    barrier = threading.Barrier(3, timeout=10)

    class Meet(kv_topspin.StoreServicer):
        def Get(self, request: kv_pb2.GetRequest, context: topspin.ServicerContext) -> kv_pb2.Entry:
            barrier.wait()  # only returns once three handlers are in at the same time
            return kv_pb2.Entry(key=request.key)

    server = topspin.Server(max_workers=4)
    kv_topspin.add_StoreServicer_to_server(Meet(), server)
    addr = server.start("tcp://127.0.0.1:0")
    try:
        c = kv_topspin.StoreClient(topspin.Channel(addr))
        for _ in range(2):  # twice: the second round runs on threads that were idle
            out: list[str] = []
            ts = [
                threading.Thread(
                    target=lambda k=k, o=out: o.append(c.Get(kv_pb2.GetRequest(key=k)).key)
                )
                for k in "abc"
            ]
            for t in ts:
                t.start()
            for t in ts:
                t.join(20)
            assert sorted(out) == ["a", "b", "c"]
    finally:
        server.stop(1)


ORIGINS = ["http://page.example", "http://localhost:8080", "http://other.example"]


@pytest.mark.parametrize(
    ("options", "accepted"),
    [
        ({}, []),
        (
            {"ws_allow_origins": ["http://page.example", "http://localhost:*"]},
            ["http://page.example", "http://localhost:8080"],
        ),
        ({"ws_allow_any_origin": True}, ORIGINS),
    ],
)
def test_websocket_origins(options: dict[str, Any], accepted: list[str]) -> None:
    server = topspin.Server(**options)
    kv_topspin.add_StoreServicer_to_server(kv_server.SyncStore(kv_server.Store()), server)
    address = server.start("ws://127.0.0.1:0/")
    try:
        own = "http://" + address.split("://", 1)[1].split("/", 1)[0]
        assert ws_upgrade_status(address, own) == 101  # the server's own origin, always
        for origin in ORIGINS:
            want = 101 if origin in accepted else 403
            assert ws_upgrade_status(address, origin) == want, origin
    finally:
        server.stop(1)


class CycleFail(kv_topspin.StoreServicer):
    """Streaming handlers whose error is kept in a reference cycle (`e` is a local of the
    frame its traceback holds): common, and then only the garbage collector frees it."""

    def Watch(
        self, request: kv_pb2.WatchRequest, context: topspin.ServicerContext
    ) -> Iterator[kv_pb2.Event]:
        e = topspin.StatusError(topspin.Code.NOT_FOUND, "watch")
        yield kv_pb2.Event(deleted="x")
        raise e

    def GetMany(
        self, request: Iterator[kv_pb2.GetRequest], context: topspin.ServicerContext
    ) -> Iterator[kv_pb2.Entry]:
        for r in request:
            e = topspin.StatusError(topspin.Code.NOT_FOUND, r.key)
            raise e
        yield kv_pb2.Entry()


class AsyncCycleFail(kv_topspin.StoreAsyncServicer):
    async def Watch(
        self, request: kv_pb2.WatchRequest, context: topspin.ServicerContext
    ) -> AsyncIterator[kv_pb2.Event]:
        e = topspin.StatusError(topspin.Code.NOT_FOUND, "watch")
        yield kv_pb2.Event(deleted="x")
        raise e

    async def GetMany(
        self, request: AsyncIterator[kv_pb2.GetRequest], context: topspin.ServicerContext
    ) -> AsyncIterator[kv_pb2.Entry]:
        async for r in request:
            e = topspin.StatusError(topspin.Code.NOT_FOUND, r.key)
            raise e
        yield kv_pb2.Entry()


@pytest.mark.parametrize("servicer", [CycleFail, AsyncCycleFail])
def test_stream_error_kept_alive_still_ends_the_call(servicer: Any) -> None:
    """The status of a failed stream reaches the client at once even while the handler's
    exception (and through its traceback the server's frame, with the response sender) is
    still alive: the sender is closed when the handler is done."""
    gc.disable()  # the cycle must not be collected by chance
    server = topspin.Server()
    kv_topspin.add_StoreServicer_to_server(servicer(), server)
    try:
        store = kv_topspin.StoreClient(topspin.Channel(server.start("tcp://127.0.0.1:0")))
        for call in (
            lambda: list(store.Watch(kv_pb2.WatchRequest(), timeout=3)),
            lambda: list(store.GetMany(iter([kv_pb2.GetRequest(key="k")]), timeout=3)),
        ):
            t0 = time.monotonic()
            with pytest.raises(topspin.StatusError) as e:
                call()
            assert e.value.code == topspin.Code.NOT_FOUND, e.value
            assert time.monotonic() - t0 < 1.0
    finally:
        gc.enable()
        server.stop(grace=1)
