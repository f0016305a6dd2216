"""The key-value store of examples/kvstore, served from Python (blocking or asyncio handlers).

python -m topspin.gen -I ../../examples/kvstore/proto kv/v1/kv.proto -o gen_out
PYTHONPATH=gen_out python examples/kv_server.py tcp://127.0.0.1:50051 [--async]
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import AsyncIterator, Dict, Iterable, Iterator

from kv.v1 import kv_pb2, kv_topspin

import topspin


class Store:
    """The data, shared by both servicers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: Dict[str, kv_pb2.Entry] = {}

    def get(self, key: str) -> kv_pb2.Entry:
        with self.lock:
            e = self.entries.get(key)
        if e is None:
            raise topspin.StatusError(topspin.Code.NOT_FOUND, f"no key {key!r}")
        return e

    def put(self, p: kv_pb2.PutRequest) -> int:
        with self.lock:
            old = self.entries.get(p.key)
            have = old.version if old is not None else 0
            if p.HasField("expected_version") and p.expected_version != have:
                raise topspin.StatusError(
                    topspin.Code.FAILED_PRECONDITION, f"{p.key!r} is at version {have}"
                )
            e = kv_pb2.Entry(key=p.key, value=p.value, version=have + 1)
            self.entries[p.key] = e
            return e.version

    def delete(self, key: str) -> bool:
        with self.lock:
            return self.entries.pop(key, None) is not None

    def snapshot(self, prefix: str) -> list[kv_pb2.Entry]:
        with self.lock:
            return [e for k, e in sorted(self.entries.items()) if k.startswith(prefix)]


class SyncStore(kv_topspin.StoreServicer):
    """Blocking handlers (they run on the server's thread pool)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def Get(self, request: kv_pb2.GetRequest, context: topspin.ServicerContext) -> kv_pb2.Entry:
        return self.store.get(request.key)

    def Put(
        self, request: kv_pb2.PutRequest, context: topspin.ServicerContext
    ) -> kv_pb2.PutResponse:
        return kv_pb2.PutResponse(version=self.store.put(request))

    def Delete(
        self, request: kv_pb2.DeleteRequest, context: topspin.ServicerContext
    ) -> kv_pb2.DeleteResponse:
        return kv_pb2.DeleteResponse(existed=self.store.delete(request.key))

    def Watch(
        self, request: kv_pb2.WatchRequest, context: topspin.ServicerContext
    ) -> Iterable[kv_pb2.Event]:
        # Only the existing entries: this example has no change feed.
        for e in self.store.snapshot(request.prefix):
            yield kv_pb2.Event(put=e)

    def Apply(
        self, request: Iterator[kv_pb2.Mutation], context: topspin.ServicerContext
    ) -> kv_pb2.ApplySummary:
        s = kv_pb2.ApplySummary()
        for m in request:
            if m.HasField("put"):
                self.store.put(m.put)
                s.puts += 1
            elif self.store.delete(m.delete.key):
                s.deletes += 1
        return s

    def GetMany(
        self, request: Iterator[kv_pb2.GetRequest], context: topspin.ServicerContext
    ) -> Iterable[kv_pb2.Entry]:
        for r in request:
            yield self.store.get(r.key)


class AsyncStore(kv_topspin.StoreAsyncServicer):
    """`async def` handlers (they run on the server's event loop)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def Get(
        self, request: kv_pb2.GetRequest, context: topspin.ServicerContext
    ) -> kv_pb2.Entry:
        return self.store.get(request.key)

    async def Put(
        self, request: kv_pb2.PutRequest, context: topspin.ServicerContext
    ) -> kv_pb2.PutResponse:
        return kv_pb2.PutResponse(version=self.store.put(request))

    async def Delete(
        self, request: kv_pb2.DeleteRequest, context: topspin.ServicerContext
    ) -> kv_pb2.DeleteResponse:
        return kv_pb2.DeleteResponse(existed=self.store.delete(request.key))

    async def Watch(
        self, request: kv_pb2.WatchRequest, context: topspin.ServicerContext
    ) -> AsyncIterator[kv_pb2.Event]:
        for e in self.store.snapshot(request.prefix):
            yield kv_pb2.Event(put=e)

    async def Apply(
        self, request: AsyncIterator[kv_pb2.Mutation], context: topspin.ServicerContext
    ) -> kv_pb2.ApplySummary:
        s = kv_pb2.ApplySummary()
        async for m in request:
            if m.HasField("put"):
                self.store.put(m.put)
                s.puts += 1
            elif self.store.delete(m.delete.key):
                s.deletes += 1
        return s

    async def GetMany(
        self, request: AsyncIterator[kv_pb2.GetRequest], context: topspin.ServicerContext
    ) -> AsyncIterator[kv_pb2.Entry]:
        async for r in request:
            yield self.store.get(r.key)


def main() -> None:
    address = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:50051"
    use_async = "--async" in sys.argv
    server = topspin.Server()
    store = Store()
    if use_async:
        kv_topspin.add_StoreServicer_to_server(AsyncStore(store), server)
    else:
        kv_topspin.add_StoreServicer_to_server(SyncStore(store), server)
    if use_async:

        async def run() -> None:
            print("listening on", await server.start_async(address), flush=True)
            await asyncio.Event().wait()

        try:
            asyncio.run(run())
        except KeyboardInterrupt:
            pass
        return
    try:
        print("listening on", server.start(address), flush=True)
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop(5)


if __name__ == "__main__":
    main()
