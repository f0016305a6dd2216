"""topspin against grpcio from Python: echo 20 B and 2 MB (blocking and asyncio) and throughput
with 64 calls in flight on one connection (asyncio), with CPU per call.

    .venv/bin/python bench/bench.py [--seconds 2] [--json out.json]

Each server runs in a process of its own (Python handlers: topspin `async def`, grpc.aio);
the client is this process. CPU per call is client + server CPU time over the calls made.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Awaitable, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(HERE, "gen_out")


def generate() -> None:
    from grpc_tools import protoc

    from topspin.gen import generate as ts_generate

    ts_generate(["echo.proto"], [HERE], GEN)
    rc = protoc.main(["protoc", f"-I{HERE}", f"--grpc_python_out={GEN}", "echo.proto"])
    if rc != 0:
        raise SystemExit("grpc_tools.protoc failed")


# --- servers (run with --serve KIND) ----------------------------------------------------------


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("closed")
        got += k
    return bytes(buf)


def serve_raw() -> None:
    """The floor: a length-prefixed echo over a plain blocking socket, one thread per client."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen()
    print(f"listening on 127.0.0.1:{ls.getsockname()[1]}", flush=True)

    def client(c: socket.socket) -> None:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                n = struct.unpack("<I", _recv_exact(c, 4))[0]
                c.sendall(struct.pack("<I", n) + _recv_exact(c, n))
        except (ConnectionError, OSError):
            c.close()

    while True:
        c, _ = ls.accept()
        threading.Thread(target=client, args=(c,), daemon=True).start()


class RawClient:
    def __init__(self, addr: str) -> None:
        host, port = addr.rsplit(":", 1)
        self.s = socket.create_connection((host, int(port)))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def echo(self, data: bytes) -> bytes:
        self.s.sendall(struct.pack("<I", len(data)) + data)
        n = struct.unpack("<I", _recv_exact(self.s, 4))[0]
        return _recv_exact(self.s, n)


def serve(kind: str) -> None:
    if kind == "raw":
        serve_raw()
        return
    sys.path.insert(0, GEN)
    import echo_pb2

    if kind == "topspin":
        import echo_topspin

        import topspin

        class Echo(echo_topspin.EchoAsyncServicer):
            async def Echo(
                self, request: echo_pb2.Msg, context: topspin.ServicerContext
            ) -> echo_pb2.Msg:
                return request

        async def run_ts() -> None:
            s = topspin.Server()
            echo_topspin.add_EchoServicer_to_server(Echo(), s)
            print("listening on", await s.start_async("tcp://127.0.0.1:0"), flush=True)
            await asyncio.Event().wait()

        asyncio.run(run_ts())
    else:
        import echo_pb2_grpc
        import grpc

        class GEcho(echo_pb2_grpc.EchoServicer):  # type: ignore[misc]
            async def Echo(self, request: echo_pb2.Msg, context: Any) -> echo_pb2.Msg:
                return request

        async def run_grpc() -> None:
            opts = [
                ("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20),
            ]
            s = grpc.aio.server(options=opts)
            echo_pb2_grpc.add_EchoServicer_to_server(GEcho(), s)
            port = s.add_insecure_port("127.0.0.1:0")
            await s.start()
            print(f"listening on 127.0.0.1:{port}", flush=True)
            await s.wait_for_termination()

        asyncio.run(run_grpc())


def start_server(kind: str) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    line = p.stdout.readline().split()
    if len(line) != 3:
        p.kill()
        raise SystemExit(f"{kind} server did not start")
    return p, line[2]


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- measurement -----------------------------------------------------------------------------


class Result:
    def __init__(self, name: str, calls: int, secs: float, lat: List[float], cpu: float) -> None:
        self.name = name
        self.calls = calls
        self.rate = calls / secs
        lat = sorted(lat)
        self.median_us = statistics.median(lat) * 1e6 if lat else float("nan")
        self.p99_us = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6 if lat else float("nan")
        self.cpu_us = cpu / calls * 1e6

    def row(self) -> str:
        return (
            f"{self.name:<28} {self.rate:>10.0f} {self.median_us:>10.1f} {self.p99_us:>10.1f}"
            f" {self.cpu_us:>10.1f}"
        )


def measure_sync(name: str, call: Callable[[], object], seconds: float, pid: int) -> Result:
    for _ in range(20):
        call()
    lat: List[float] = []
    s0, c0 = proc_cpu(pid), time.process_time()
    t0 = time.perf_counter()
    end = t0 + seconds
    while True:
        a = time.perf_counter()
        if a >= end:
            break
        call()
        lat.append(time.perf_counter() - a)
    secs = time.perf_counter() - t0
    cpu = time.process_time() - c0 + proc_cpu(pid) - s0
    return Result(name, len(lat), secs, lat, cpu)


def measure_async(
    name: str, call: Callable[[], Awaitable[Any]], seconds: float, pid: int, inflight: int
) -> Result:
    async def run() -> Result:
        for _ in range(20):
            await call()
        lat: List[float] = []
        end = time.perf_counter() + seconds

        async def worker() -> None:
            while True:
                a = time.perf_counter()
                if a >= end:
                    return
                await call()
                lat.append(time.perf_counter() - a)

        s0, c0 = proc_cpu(pid), time.process_time()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(inflight)))
        secs = time.perf_counter() - t0
        cpu = time.process_time() - c0 + proc_cpu(pid) - s0
        return Result(name, len(lat), secs, lat, cpu)

    return asyncio.run(run())


def run_sync(
    mods: Any, taddr: str, gaddr: str, raddr: str, pids: List[int], secs: float
) -> List[Result]:
    """Blocking clients; the floor: raw Python sockets (serialized message, no framework)."""
    echo_pb2, echo_pb2_grpc, echo_topspin, grpc, topspin = mods
    tpid, gpid, rpid = pids
    results: List[Result] = []
    raw = RawClient(raddr)
    tc = echo_topspin.EchoClient(topspin.Channel(taddr))
    gch = grpc.insecure_channel(gaddr, options=GRPC_OPTS)
    gc = echo_pb2_grpc.EchoStub(gch)
    for label, msg in (("20 B", small_msg(echo_pb2)), ("2 MB", big_msg(echo_pb2))):
        payload = msg.SerializeToString()
        results.append(
            measure_sync(f"raw socket {label}", functools.partial(raw.echo, payload), secs, rpid)
        )
        results.append(
            measure_sync(f"topspin sync {label}", functools.partial(tc.Echo, msg), secs, tpid)
        )
        results.append(
            measure_sync(f"grpcio sync {label}", functools.partial(gc.Echo, msg), secs, gpid)
        )
    gch.close()
    return results


def run_async(mods: Any, taddr: str, gaddr: str, pids: List[int], secs: float) -> List[Result]:
    """asyncio clients: one call at a time, then 64 in flight on one connection."""
    echo_pb2, echo_pb2_grpc, echo_topspin, grpc, topspin = mods
    tpid, gpid = pids
    results: List[Result] = []
    atc = echo_topspin.EchoAsyncClient(topspin.AsyncChannel(taddr))
    small, big = small_msg(echo_pb2), big_msg(echo_pb2)
    for label, msg, n in (("20 B", small, 1), ("2 MB", big, 1), ("20 B x64", small, 64)):
        results.append(
            measure_async(
                f"topspin asyncio {label}", functools.partial(atc.Echo, msg), secs, tpid, n
            )
        )

        # grpc.aio channels belong to one loop: made inside it.
        holder: Dict[str, Any] = {}

        def gcall(m: Any = msg, h: Dict[str, Any] = holder) -> Awaitable[Any]:
            if "c" not in h:
                h["c"] = echo_pb2_grpc.EchoStub(grpc.aio.insecure_channel(gaddr, options=GRPC_OPTS))
            r: Awaitable[Any] = h["c"].Echo(m)
            return r

        results.append(measure_async(f"grpc.aio {label}", gcall, secs, gpid, n))
    return results


def report(results: List[Result]) -> None:
    print(
        f"\n{'workload':<28} {'calls/s':>10} {'median us':>10} {'p99 us':>10} {'CPU us/call':>10}"
    )
    for r in results:
        print(r.row())
    by = {r.name: r for r in results}
    print()
    for label in ("sync 20 B", "sync 2 MB"):
        t, g, f = by[f"topspin {label}"], by[f"grpcio {label}"], by[f"raw socket {label[5:]}"]
        print(
            f"{label}: median latency topspin/raw x{t.median_us / f.median_us:.2f}, "
            f"grpcio/raw x{g.median_us / f.median_us:.2f}"
        )
        print(
            f"{label}: topspin/grpcio calls/s x{t.rate / g.rate:.2f}, median latency "
            f"grpcio/topspin x{g.median_us / t.median_us:.2f}, CPU/call grpcio/topspin "
            f"x{g.cpu_us / t.cpu_us:.2f}"
        )
    for label in ("20 B", "2 MB", "20 B x64"):
        t, g = by[f"topspin asyncio {label}"], by[f"grpc.aio {label}"]
        print(
            f"asyncio {label}: topspin/grpc.aio calls/s x{t.rate / g.rate:.2f}, median latency "
            f"grpc.aio/topspin x{g.median_us / t.median_us:.2f}, CPU/call grpc.aio/topspin "
            f"x{g.cpu_us / t.cpu_us:.2f}"
        )


GRPC_OPTS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]


def small_msg(echo_pb2: Any) -> Any:
    return echo_pb2.Msg(data=b"x" * 20)


_BIG: Dict[str, Any] = {}


def big_msg(echo_pb2: Any) -> Any:
    """One 2 MB message for the whole run (the same random bytes for every system)."""
    if "m" not in _BIG:
        _BIG["m"] = echo_pb2.Msg(data=os.urandom(2 << 20))
    return _BIG["m"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", choices=["topspin", "grpc", "raw"])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--json")
    ap.add_argument("--generate", action="store_true", help="only generate the code")
    a = ap.parse_args()
    if a.serve:
        serve(a.serve)
        return
    generate()
    if a.generate:
        return
    sys.path.insert(0, GEN)
    import echo_pb2
    import echo_pb2_grpc
    import echo_topspin
    import grpc

    import topspin

    mods = (echo_pb2, echo_pb2_grpc, echo_topspin, grpc, topspin)
    tp, taddr = start_server("topspin")
    gp, gaddr = start_server("grpc")
    rp, raddr = start_server("raw")
    try:
        results = run_sync(mods, taddr, gaddr, raddr, [tp.pid, gp.pid, rp.pid], a.seconds)
        results += run_async(mods, taddr, gaddr, [tp.pid, gp.pid], a.seconds)
    finally:
        tp.kill()
        gp.kill()
        rp.kill()
    report(results)
    if a.json:
        with open(a.json, "w") as out:
            json.dump([r.__dict__ for r in results], out, indent=1)


if __name__ == "__main__":
    main()
