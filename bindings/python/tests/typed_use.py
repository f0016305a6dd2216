"""Not a test: mypy checks that generated clients and servicers are typed (see test_typing)."""

from __future__ import annotations

from kv.v1 import kv_pb2, kv_topspin

import topspin


def use(c: kv_topspin.StoreClient) -> str:
    e: kv_pb2.Entry = c.Get(kv_pb2.GetRequest(key="a"), timeout=1.0)
    for ev in c.Watch(kv_pb2.WatchRequest(prefix="p")):
        if ev.HasField("put"):
            return ev.put.value
    s: kv_pb2.ApplySummary = c.Apply(iter([kv_pb2.Mutation()]))
    return e.value + str(s.puts)


async def use_async(c: kv_topspin.StoreAsyncClient) -> int:
    r = await c.Put(kv_pb2.PutRequest(key="a", value="b", expected_version=1))
    n = 0
    async for e in c.GetMany([kv_pb2.GetRequest(key="a")]):
        n += e.version
    return n + r.version


class Impl(kv_topspin.StoreServicer):
    def Get(self, request: kv_pb2.GetRequest, context: topspin.ServicerContext) -> kv_pb2.Entry:
        return kv_pb2.Entry(key=request.key)
