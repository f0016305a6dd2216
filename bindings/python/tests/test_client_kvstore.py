"""The Python client against the Rust kvstore server, every call kind, TCP and Unix sockets."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from kv.v1 import kv_pb2, kv_topspin

import topspin


def key() -> str:
    return "k-" + uuid.uuid4().hex[:8]


def test_sync_unary(kv_server: str) -> None:
    with topspin.Channel(kv_server) as ch:
        c = kv_topspin.StoreClient(ch)
        k = key()
        r = c.Put(kv_pb2.PutRequest(key=k, value="v1"), timeout=5)
        assert r.version == 1
        e = c.Get(kv_pb2.GetRequest(key=k))
        assert (e.key, e.value, e.version) == (k, "v1", 1)
        e2, info = c.Get.with_call(kv_pb2.GetRequest(key=k), metadata=[("user", "ann")])
        assert e2 == e
        assert isinstance(info.headers, list) and isinstance(info.trailers, list)
        assert c.Delete(kv_pb2.DeleteRequest(key=k)).existed
        with pytest.raises(topspin.StatusError) as ei:
            c.Get(kv_pb2.GetRequest(key=k))
        assert ei.value.code == topspin.Code.NOT_FOUND
        assert ei.value.code is topspin.Code.NOT_FOUND
        assert k in ei.value.message
        # Compare-and-set fails with FAILED_PRECONDITION.
        with pytest.raises(topspin.StatusError) as ei:
            c.Put(kv_pb2.PutRequest(key=k, value="x", expected_version=7))
        assert ei.value.code == topspin.Code.FAILED_PRECONDITION


def test_sync_streams(kv_server: str) -> None:
    ch = topspin.Channel(kv_server)
    c = kv_topspin.StoreClient(ch)
    p = key()
    muts = [kv_pb2.Mutation(put=kv_pb2.PutRequest(key=f"{p}/{i}", value=str(i))) for i in range(50)]
    s = c.Apply(iter(muts))
    assert (s.puts, s.deletes) == (50, 0)
    got = [e.key for e in c.GetMany(kv_pb2.GetRequest(key=f"{p}/{i}") for i in range(50))]
    assert got == [f"{p}/{i}" for i in range(50)]
    w = c.Watch(kv_pb2.WatchRequest(prefix=p, include_existing=True))
    first = [next(w) for _ in range(50)]
    assert sorted(ev.put.key for ev in first) == sorted(f"{p}/{i}" for i in range(50))
    # A change arrives on the open watch.
    c.Put(kv_pb2.PutRequest(key=f"{p}/new", value="n"))
    ev = next(w)
    assert ev.put.key == f"{p}/new"
    w.cancel()
    # GetMany of a missing key fails the stream with NOT_FOUND.
    with pytest.raises(topspin.StatusError) as ei:
        list(c.GetMany(iter([kv_pb2.GetRequest(key=f"{p}/absent")])))
    assert ei.value.code == topspin.Code.NOT_FOUND


def test_sync_deadline(kv_server: str) -> None:
    c = kv_topspin.StoreClient(topspin.Channel(kv_server))
    w = c.Watch(kv_pb2.WatchRequest(prefix=key()), timeout=0.2)
    t0 = time.monotonic()
    with pytest.raises(topspin.StatusError) as ei:
        next(w)
    assert ei.value.code == topspin.Code.DEADLINE_EXCEEDED
    assert time.monotonic() - t0 < 5


def test_unavailable() -> None:
    c = kv_topspin.StoreClient(topspin.Channel("tcp://127.0.0.1:1"))
    with pytest.raises(topspin.StatusError) as ei:
        c.Get(kv_pb2.GetRequest(key="a"), timeout=5)
    assert ei.value.code == topspin.Code.UNAVAILABLE


def test_async_all_kinds(kv_server: str) -> None:
    async def main() -> None:
        async with topspin.AsyncChannel(kv_server) as ch:
            c = kv_topspin.StoreAsyncClient(ch)
            k = key()
            assert (await c.Put(kv_pb2.PutRequest(key=k, value="a"))).version == 1
            e = await c.Get(kv_pb2.GetRequest(key=k), timeout=5, metadata=[("x-bin", b"\x00")])
            assert e.value == "a"
            e2, info = await c.Get.with_call(kv_pb2.GetRequest(key=k))
            assert e2 == e and isinstance(info.trailers, list)
            with pytest.raises(topspin.StatusError) as ei:
                await c.Get(kv_pb2.GetRequest(key=k + "x"))
            assert ei.value.code == topspin.Code.NOT_FOUND

            async def muts():  # type: ignore[no-untyped-def]
                for i in range(20):
                    yield kv_pb2.Mutation(put=kv_pb2.PutRequest(key=f"{k}/{i}", value="v"))
                yield kv_pb2.Mutation(delete=kv_pb2.DeleteRequest(key=k))

            s = await c.Apply(muts())
            assert (s.puts, s.deletes) == (20, 1)
            keys = [kv_pb2.GetRequest(key=f"{k}/{i}") for i in range(20)]
            got = [e.key async for e in c.GetMany(keys)]
            assert got == [r.key for r in keys]
            w = c.Watch(kv_pb2.WatchRequest(prefix=k + "/", include_existing=True))
            n = 0
            async for _ in w:
                n += 1
                if n == 20:
                    break
            w.cancel()
            # 64 calls in flight on one connection.
            rs = await asyncio.gather(*(c.Get(kv_pb2.GetRequest(key=r.key)) for r in keys * 3))
            assert [r.key for r in rs] == [r.key for r in keys * 3]

    asyncio.run(main())


def test_async_cancel_and_timeout(kv_server: str) -> None:
    async def main() -> None:
        c = kv_topspin.StoreAsyncClient(topspin.AsyncChannel(kv_server))
        w = c.Watch(kv_pb2.WatchRequest(prefix=key()))

        async def first() -> object:
            return await w.__anext__()

        t = asyncio.ensure_future(first())
        await asyncio.sleep(0.1)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        # The channel goes on.
        with pytest.raises(topspin.StatusError) as ei:
            await c.Get(kv_pb2.GetRequest(key=key()))
        assert ei.value.code == topspin.Code.NOT_FOUND
        w2 = c.Watch(kv_pb2.WatchRequest(prefix=key()), timeout=0.2)
        with pytest.raises(topspin.StatusError) as ei:
            await w2.__anext__()
        assert ei.value.code == topspin.Code.DEADLINE_EXCEEDED
        # asyncio.wait_for around a unary call cancels it.
        s = c.Apply((kv_pb2.Mutation(put=kv_pb2.PutRequest(key=key())) for _ in range(1)))
        assert (await s).puts == 1

    asyncio.run(main())
