"""Health checking (`grpc.health.v1`) and server reflection on Python servers (blocking and
asyncio): Check and Watch from the Python client (native face) and grpcio (gRPC face),
reflection's list, and grpcurl and the `topspin` CLI end to end (list, describe, calls,
health), as go/tools/interop/grpcface_test.go does against the Go server.

grpcurl: see conftest.grpcurl (with TOPSPIN_INTEROP=1, as scripts/test-python.sh runs them, a
missing grpcurl fails the tests instead of skipping them)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from typing import Any, Iterator, NamedTuple

import kv_server
import pytest
from conftest import ROOT, binary, grpcurl
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from kv.v1 import kv_topspin

import topspin
from topspin import _native

HEALTH_PROTO = (
    os.path.join(ROOT, "crates", "topspin-health", "proto"),
    "grpc/health/v1/health.proto",
)
REFLECTION_PROTO = (
    os.path.join(ROOT, "crates", "topspin-reflection", "proto"),
    "topspin/reflection/v1/reflection.proto",
)


def messages(include: str, proto: str) -> descriptor_pool.DescriptorPool:
    """A pool of its own for `proto` (so nothing clashes with grpcio's `grpc` package or the
    default pool)."""
    fds = descriptor_pb2.FileDescriptorSet.FromString(_native.parse_protos([proto], [include]))
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    return pool


def message(pool: descriptor_pool.DescriptorPool, name: str) -> Any:
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


HEALTH = messages(*HEALTH_PROTO)
CheckRequest = message(HEALTH, "grpc.health.v1.HealthCheckRequest")
CheckResponse = message(HEALTH, "grpc.health.v1.HealthCheckResponse")
REFLECTION = messages(*REFLECTION_PROTO)
ListRequest = message(REFLECTION, "topspin.reflection.v1.ListServicesRequest")
ListResponse = message(REFLECTION, "topspin.reflection.v1.ListServicesResponse")

SERVING, NOT_SERVING, SERVICE_UNKNOWN = (
    topspin.ServingStatus.SERVING,
    topspin.ServingStatus.NOT_SERVING,
    topspin.ServingStatus.SERVICE_UNKNOWN,
)


class Running(NamedTuple):
    address: str  # tcp://127.0.0.1:port
    server: topspin.Server
    health: topspin.Health
    stop: Any  # () -> None: a graceful stop


def kv_with_health(asyncio_handlers: bool) -> tuple[topspin.Server, topspin.Health]:
    """The Python kv server with health (the server and kv.v1.Store SERVING) and reflection."""
    server = topspin.Server()
    store = kv_server.Store()
    servicer: Any = kv_server.AsyncStore(store) if asyncio_handlers else kv_server.SyncStore(store)
    kv_topspin.add_StoreServicer_to_server(servicer, server)
    health = server.add_health()
    health.set_serving("kv.v1.Store")
    server.add_reflection()
    return server, health


def start_blocking() -> Running:
    server, health = kv_with_health(False)
    return Running(server.start("tcp://127.0.0.1:0"), server, health, lambda: server.stop(1))


def start_asyncio() -> Running:
    """`await server.start_async()` on a loop of its own thread (as an asyncio program does),
    `async def` handlers."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server, health = kv_with_health(True)
    address = asyncio.run_coroutine_threadsafe(server.start_async("tcp://127.0.0.1:0"), loop)

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(server.stop_async(1), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()

    return Running(address.result(10), server, health, stop)


@pytest.fixture(params=["blocking", "asyncio"])
def running(request: pytest.FixtureRequest) -> Iterator[Running]:
    r = start_blocking() if request.param == "blocking" else start_asyncio()
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            r.stop()

    try:
        yield r._replace(stop=stop)
    finally:
        stop()


def hostport(address: str) -> str:
    return address.split("://", 1)[1]


def test_health_check_and_watch(running: Running) -> None:
    with topspin.Channel(running.address, timeout=10) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check", CheckResponse)
        assert check(CheckRequest(service="")).status == SERVING
        assert check(CheckRequest(service="kv.v1.Store")).status == SERVING
        with pytest.raises(topspin.StatusError) as e:
            check(CheckRequest(service="no.Such"))
        assert e.value.code == topspin.Code.NOT_FOUND

        watch: topspin.UnaryStream[Any, Any] = topspin.UnaryStream(
            ch, "/grpc.health.v1.Health/Watch", CheckResponse
        )
        store = watch(CheckRequest(service="kv.v1.Store"))
        assert next(store).status == SERVING
        running.health.set_not_serving("kv.v1.Store")
        assert next(store).status == NOT_SERVING
        assert check(CheckRequest(service="kv.v1.Store")).status == NOT_SERVING
        running.health.clear("kv.v1.Store")
        assert next(store).status == SERVICE_UNKNOWN
        # A service with no status yet: SERVICE_UNKNOWN, and the watch waits for it.
        later = watch(CheckRequest(service="later.Service"))
        assert next(later).status == SERVICE_UNKNOWN
        running.health.set("later.Service", SERVING)  # (grpcio's `set`)
        assert next(later).status == SERVING
        assert running.health.status("later.Service") == SERVING
        # A graceful stop: NOT_SERVING, then the watches end.
        running.stop()
        assert [r.status for r in later] == [NOT_SERVING]
        assert running.health.status("") == NOT_SERVING


def test_health_over_grpcio(running: Running) -> None:
    """A gRPC client (grpcio) on the same port: Check and Watch, as a gRPC health probe."""
    import grpc

    with grpc.insecure_channel(hostport(running.address)) as ch:
        check = ch.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=CheckRequest.SerializeToString,
            response_deserializer=CheckResponse.FromString,
        )
        assert check(CheckRequest(service="kv.v1.Store"), timeout=10).status == SERVING
        with pytest.raises(grpc.RpcError) as e:
            check(CheckRequest(service="no.Such"), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        watch = ch.unary_stream(
            "/grpc.health.v1.Health/Watch",
            request_serializer=CheckRequest.SerializeToString,
            response_deserializer=CheckResponse.FromString,
        )
        stream = watch(CheckRequest(service="kv.v1.Store"), timeout=10)
        assert next(stream).status == SERVING
        running.health.set_not_serving("kv.v1.Store")
        assert next(stream).status == NOT_SERVING
        stream.cancel()


def test_reflection_lists_the_services(running: Running) -> None:
    with topspin.Channel(running.address, timeout=10) as ch:
        ls = ch.unary_unary("/topspin.reflection.v1.Reflection/ListServices", ListResponse)
        services = {s.name: s for s in ls(ListRequest()).services}
    assert sorted(services) == [
        "grpc.health.v1.Health",
        "kv.v1.Store",
        "topspin.reflection.v1.Reflection",
    ]
    store = services["kv.v1.Store"]
    assert store.file == "kv/v1/kv.proto"
    methods = {m.name: m for m in store.methods}
    assert sorted(methods) == ["Apply", "Delete", "Get", "GetMany", "Put", "Watch"]
    assert methods["GetMany"].client_streaming and methods["GetMany"].server_streaming
    assert methods["Get"].input_type == "kv.v1.GetRequest"


def test_health_and_reflection_api() -> None:
    server = topspin.Server()
    health = server.add_health()
    assert server.add_health() is health
    assert health.status() == SERVING and health.status("x") is None
    health.shutdown()
    health.set_serving("x")  # ignored until resume
    assert health.status() == NOT_SERVING and health.status("x") is None
    health.resume()
    assert health.status() == SERVING
    health.set("", topspin.ServingStatus.SERVICE_UNKNOWN)
    assert health.status() is None
    with pytest.raises(ValueError, match="no serving status 7"):
        health.set("", 7)
    with pytest.raises(ValueError, match="no service no.such.Service"):
        server.add_reflection(["kv.v1.Store", "no.such.Service"])
    server.add_reflection(["kv.v1.Store"])
    # A service of its own under a name health or reflection serves: refused at start.
    clash = topspin.Server()
    clash.add_method(
        topspin.MethodHandler(
            "/grpc.health.v1.Health/Check", "unary", lambda r, c: r, CheckRequest, CheckResponse
        )
    )
    clash.add_health()
    with pytest.raises(ValueError, match="grpc.health.v1.Health has methods of its own"):
        clash.start("tcp://127.0.0.1:0")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30)


def test_grpcurl(running: Running) -> None:
    g = grpcurl()
    addr = hostport(running.address)
    r = run(g, "-plaintext", addr, "list")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
        "kv.v1.Store",
        "topspin.reflection.v1.Reflection",
    ]
    r = run(g, "-plaintext", addr, "describe", "kv.v1.Store")
    assert r.returncode == 0, r.stderr
    assert "kv.v1.Store is a service:" in r.stdout
    assert "rpc Apply ( stream .kv.v1.Mutation ) returns ( .kv.v1.ApplySummary );" in r.stdout
    r = run(g, "-plaintext", addr, "describe", "kv.v1.PutRequest")
    assert "optional uint64 expected_version = 3;" in r.stdout, r.stderr
    r = run(g, "-plaintext", "-d", '{"key": "a", "value": "1"}', addr, "kv.v1.Store/Put")
    assert r.returncode == 0 and '"version": "1"' in r.stdout, r.stderr
    r = run(g, "-plaintext", "-d", '{"key": "a"} {"key": "a"}', addr, "kv.v1.Store/GetMany")
    assert r.returncode == 0 and r.stdout.count('"value": "1"') == 2, r.stderr
    r = run(g, "-plaintext", "-d", '{"key": "nope"}', addr, "kv.v1.Store/Get")
    assert r.returncode != 0 and "NotFound" in r.stderr, r.stdout
    r = run(
        g, "-plaintext", "-d", '{"service": "kv.v1.Store"}', addr, "grpc.health.v1.Health/Check"
    )
    assert r.returncode == 0 and '"status": "SERVING"' in r.stdout, r.stderr


def test_topspin_cli(running: Running) -> None:
    """The `topspin` CLI through the server's reflection (no .proto): list, describe, calls,
    health (the server, a service, an unknown one, a service turned NOT_SERVING)."""
    cli = binary("topspin")
    target = running.address
    r = run(cli, "list", target)
    assert r.returncode == 0, r.stderr
    for want in (
        "kv.v1.Store\n  Get(kv.v1.GetRequest) returns (kv.v1.Entry)\n",
        "  Watch(kv.v1.WatchRequest) returns (stream kv.v1.Event)\n",
        "  GetMany(stream kv.v1.GetRequest) returns (stream kv.v1.Entry)\n",
        "grpc.health.v1.Health\n  Check(grpc.health.v1.HealthCheckRequest) returns "
        "(grpc.health.v1.HealthCheckResponse)\n",
        "topspin.reflection.v1.Reflection\n",
    ):
        assert want in r.stdout, r.stdout
    r = run(cli, "describe", target, "kv.v1.Store")
    assert r.returncode == 0, r.stderr
    assert "service Store {\n" in r.stdout, r.stdout
    assert "  rpc Apply(stream kv.v1.Mutation) returns (kv.v1.ApplySummary);\n" in r.stdout
    r = run(cli, "describe", target, "kv.v1.PutRequest")
    assert "optional uint64 expected_version = 3;" in r.stdout, r.stderr
    r = run(cli, "call", target, "kv.v1.Store/Put", "-d", '{"key": "a", "value": "1"}')
    assert r.returncode == 0 and json.loads(r.stdout) == {"version": "1"}, r.stderr
    r = run(cli, "call", target, "kv.v1.Store/GetMany", "-d", '{"key": "a"} {"key": "a"}')
    assert r.returncode == 0 and [json.loads(x)["value"] for x in r.stdout.splitlines()] == [
        "1",
        "1",
    ], r.stderr
    for service in ("", "kv.v1.Store"):
        r = run(cli, "health", target, service)
        assert (r.returncode, r.stdout.strip()) == (0, "SERVING"), r.stderr
    r = run(cli, "health", target, "no.Such")
    assert r.returncode == 2, (r.stdout, r.stderr)
    running.health.set_not_serving("kv.v1.Store")
    r = run(cli, "health", target, "kv.v1.Store")
    assert (r.returncode, r.stdout.strip()) == (1, "NOT_SERVING"), r.stderr
