"""A streaming handler's trailers (`context.set_trailing_metadata`) reach the client when the
stream ends successfully, also when they are set after the first message."""

from __future__ import annotations

import asyncio
import queue
import subprocess
from typing import AsyncIterable, AsyncIterator, Iterable, Iterator

import kv_server
import pytest
from conftest import KV_PROTO_DIR, binary
from kv.v1 import kv_pb2, kv_topspin

import topspin


class SyncTrailers(kv_server.SyncStore):
    def Watch(
        self, request: kv_pb2.WatchRequest, context: topspin.ServicerContext
    ) -> Iterator[kv_pb2.Event]:
        context.set_initial_metadata([("h", "1")])
        yield kv_pb2.Event(deleted="a")
        yield kv_pb2.Event(deleted="b")
        context.set_trailing_metadata([("count", "2"), ("sum-bin", b"\x00\x01")])

    def GetMany(
        self, request_iterator: Iterable[kv_pb2.GetRequest], context: topspin.ServicerContext
    ) -> Iterator[kv_pb2.Entry]:
        n = 0
        for r in request_iterator:
            n += 1
            yield kv_pb2.Entry(key=r.key, value="v")
        context.set_trailing_metadata([("count", str(n))])


class AsyncTrailers(kv_server.AsyncStore):
    async def Watch(
        self, request: kv_pb2.WatchRequest, context: topspin.ServicerContext
    ) -> AsyncIterator[kv_pb2.Event]:
        context.set_initial_metadata([("h", "1")])
        yield kv_pb2.Event(deleted="a")
        yield kv_pb2.Event(deleted="b")
        context.set_trailing_metadata([("count", "2"), ("sum-bin", b"\x00\x01")])

    async def GetMany(
        self, request_iterator: AsyncIterable[kv_pb2.GetRequest], context: topspin.ServicerContext
    ) -> AsyncIterator[kv_pb2.Entry]:
        n = 0
        async for r in request_iterator:
            n += 1
            yield kv_pb2.Entry(key=r.key, value="v")
        context.set_trailing_metadata([("count", str(n))])


@pytest.fixture(params=["sync", "async"])
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    s = topspin.Server()
    store = kv_server.Store()
    servicer = SyncTrailers(store) if request.param == "sync" else AsyncTrailers(store)
    kv_topspin.add_StoreServicer_to_server(servicer, s)
    bound = s.start("tcp://127.0.0.1:0")
    try:
        yield bound
    finally:
        s.stop(1)


def test_server_streaming_success_trailers_blocking(server: str) -> None:
    client = kv_topspin.StoreClient(topspin.Channel(server))
    stream = client.Watch(kv_pb2.WatchRequest(prefix=""), timeout=10)
    assert [e.deleted for e in stream] == ["a", "b"]
    assert ("h", "1") in (stream.headers() or [])
    trailers = stream.trailers() or []
    assert ("count", "2") in trailers, trailers
    assert ("sum-bin", b"\x00\x01") in trailers, trailers


def test_bidi_success_trailers_blocking(server: str) -> None:
    client = kv_topspin.StoreClient(topspin.Channel(server))
    reqs = [kv_pb2.GetRequest(key=k) for k in "xyz"]
    stream = client.GetMany(iter(reqs), timeout=10)
    assert [e.key for e in stream] == ["x", "y", "z"]
    assert ("count", "3") in (stream.trailers() or []), stream.trailers()


def test_streaming_success_trailers_asyncio(server: str) -> None:
    async def main() -> None:
        client = kv_topspin.StoreAsyncClient(topspin.AsyncChannel(server))
        stream = client.Watch(kv_pb2.WatchRequest(prefix=""), timeout=10)
        assert [e.deleted async for e in stream] == ["a", "b"]
        assert ("count", "2") in (stream.trailers() or []), stream.trailers()

        async def reqs() -> AsyncIterator[kv_pb2.GetRequest]:
            for k in "pq":
                yield kv_pb2.GetRequest(key=k)

        bidi = client.GetMany(reqs(), timeout=10)
        assert [e.key async for e in bidi] == ["p", "q"]
        assert ("count", "2") in (bidi.trailers() or []), bidi.trailers()

    asyncio.run(main())


def test_bidi_answers_one_request_at_a_time_blocking(server: str) -> None:
    # The server answers (headers included) only once it has a request: the call must be in
    # the caller's hands before then.
    client = kv_topspin.StoreClient(topspin.Channel(server))
    q: queue.Queue[kv_pb2.GetRequest | None] = queue.Queue()

    def reqs() -> Iterator[kv_pb2.GetRequest]:
        while (r := q.get(timeout=10)) is not None:
            yield r

    stream = client.GetMany(reqs(), timeout=10)
    assert stream.headers() is None  # nothing has come yet
    for k in "ab":
        q.put(kv_pb2.GetRequest(key=k))
        assert next(stream).key == k
        assert stream.headers() is not None  # with the first answer (none set: empty)
    q.put(None)
    assert list(stream) == []
    assert ("count", "2") in (stream.trailers() or []), stream.trailers()


def test_bidi_answers_one_request_at_a_time_asyncio(server: str) -> None:
    async def main() -> None:
        client = kv_topspin.StoreAsyncClient(topspin.AsyncChannel(server))
        q: asyncio.Queue[kv_pb2.GetRequest | None] = asyncio.Queue()

        async def reqs() -> AsyncIterator[kv_pb2.GetRequest]:
            while (r := await q.get()) is not None:
                yield r

        stream = client.GetMany(reqs(), timeout=10)
        for k in "ab":
            await q.put(kv_pb2.GetRequest(key=k))
            e = await asyncio.wait_for(stream.__anext__(), 10)
            assert e.key == k
            assert stream.headers() is not None
        await q.put(None)
        assert [e.key async for e in stream] == []
        assert ("count", "2") in (stream.trailers() or []), stream.trailers()

    asyncio.run(main())


def test_rust_cli_sees_the_stream_trailers(server: str) -> None:
    cli = binary("topspin")
    proto = ["--proto", "kv/v1/kv.proto", "-I", KV_PROTO_DIR]
    r = subprocess.run(
        [cli, "call", "-v", *proto, server, "kv.v1.Store/Watch", "-d", '{"prefix": ""}'],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2, r.stdout
    assert "< h: 1" in r.stderr, r.stderr  # the headers came with the first message
    assert "< trailer count: 2" in r.stderr, r.stderr
