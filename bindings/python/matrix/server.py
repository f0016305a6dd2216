"""The Python server of the cross-language matrix (testdata/matrix/README.md).

    python matrix/server.py [--tls-cert FILE --tls-key FILE] --listen tcp://127.0.0.1:0 ...

Serves matrix.v1.Matrix (`async def` handlers, on this process's event loop) on every
`--listen` address (tcp://, unix://, ws:// from pages of any origin, and with the certificate
chain and key of --tls-cert/--tls-key, PEM files, tls:// and wss://), prints `listening ADDR`
for each, and runs until SIGTERM (or SIGINT), then exits 0 within 2 s. Request compression:
gzip and zstd are accepted, as the runtime does by default. OpenTelemetry: the server
interceptor of `topspin.otel`, with an SDK tracer provider and the W3C propagator; `Unary`
answers with the header `x-trace-id`, the trace id of its call's span.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
from typing import AsyncIterator, Optional, Set

import common
from opentelemetry import trace

import topspin
import topspin.otel

common.load_generated()
import matrix_pb2 as pb  # noqa: E402
import matrix_topspin as rpc  # noqa: E402

POLL = 0.02  # how often a waiting handler looks at its call's state


class Matrix(rpc.MatrixAsyncServicer):
    """matrix.v1.Matrix; remembers the tags of the calls it saw cancelled or past deadline."""

    def __init__(self) -> None:
        self.cancelled: Set[str] = set()

    async def _wait(self, ctx: topspin.ServicerContext, tag: str, secs: Optional[float]) -> None:
        """Waits `secs` (None: forever) unless the call is cancelled or its deadline passes
        first: then records `tag` and ends the call. The runtime cancels the handler's task
        (seen for a client's cancel and for a deadline); the context's `is_cancelled()` and
        `time_remaining()` are looked at too, every 20 ms, in case they tell it first."""
        loop = asyncio.get_running_loop()
        end = None if secs is None else loop.time() + secs
        try:
            while end is None or loop.time() < end:
                if ctx.is_cancelled():
                    self.cancelled.add(tag)
                    raise topspin.StatusError(topspin.Code.CANCELLED, "cancelled")
                if ctx.time_remaining() == 0.0:
                    self.cancelled.add(tag)
                    raise topspin.StatusError(topspin.Code.DEADLINE_EXCEEDED, "deadline passed")
                await asyncio.sleep(POLL if end is None else min(POLL, end - loop.time()))
        except asyncio.CancelledError:  # the runtime cancels the handler's task
            self.cancelled.add(tag)
            raise

    async def Unary(self, request: pb.Msg, context: topspin.ServicerContext) -> pb.Msg:
        md = context.invocation_metadata()
        echo, echo_bin = common.first(md, "x-echo"), common.first(md, "x-echo-bin")
        if echo is not None:
            context.set_initial_metadata([("x-echo", echo)])
            context.set_trailing_metadata([("x-echo-t", echo)])
        if echo_bin is not None:
            context.set_initial_metadata([("x-echo-bin", echo_bin)])
        # The `trace` check: the trace of the span the instrumentation made current (it
        # continues the client's when the request carried its `traceparent`).
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            context.set_initial_metadata([("x-trace-id", common.trace_id_hex(span.trace_id))])
        return pb.Msg(payload=request.payload)

    async def ServerStream(
        self, request: pb.StreamReq, context: topspin.ServicerContext
    ) -> AsyncIterator[pb.Msg]:
        if request.hold:
            await self._wait(context, request.tag, None)
        for _ in range(request.count):
            yield pb.Msg(payload=b"a" * request.size)

    async def ClientStream(
        self, request: AsyncIterator[pb.Msg], context: topspin.ServicerContext
    ) -> pb.Summary:
        count = size = 0
        async for m in request:
            count += 1
            size += len(m.payload)
        return pb.Summary(count=count, bytes=size)

    async def Bidi(
        self, request: AsyncIterator[pb.Msg], context: topspin.ServicerContext
    ) -> AsyncIterator[pb.Msg]:
        async for m in request:
            yield pb.Msg(payload=m.payload)

    async def Fail(self, request: pb.FailReq, context: topspin.ServicerContext) -> pb.Msg:
        try:
            code = topspin.Code(request.code)
        except ValueError:
            code = topspin.Code.UNKNOWN
        # A response header set before the handler fails: it goes out before the error
        # (protocol.md §5.4), and the client finds it on its StatusError.
        context.set_initial_metadata([("x-fail-h", "v1")])
        raise topspin.StatusError(code, request.message, request.details)

    async def Sleep(self, request: pb.SleepReq, context: topspin.ServicerContext) -> pb.Msg:
        await self._wait(context, request.tag, request.millis / 1000)
        return pb.Msg()

    async def WasCancelled(self, request: pb.Tag, context: topspin.ServicerContext) -> pb.Flag:
        return pb.Flag(value=request.tag in self.cancelled)


async def serve(addresses: list[str], tls: Optional[topspin.ServerTls]) -> None:
    servicer = Matrix()
    servers = []
    for a in addresses:
        # The contract's one change to the defaults that applies here: WebSocket upgrades
        # from any origin (the Chromium client's page has an origin of its own).
        # TLS settings only where the address is TLS: the runtime refuses them on tcp:// and
        # ws:// (they would be ignored there).
        secure = a.startswith(("tls://", "wss://"))
        s = topspin.Server(
            ws_allow_any_origin=True,
            tls=tls if secure else None,
            interceptors=[topspin.otel.server_interceptor()],
        )
        rpc.add_MatrixServicer_to_server(servicer, s)
        bound = await s.start_async(a)
        servers.append(s)
        print(f"listening {bound}", flush=True)  # the runtime resolves the port
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    # Exit 0 within 2 s whatever the shutdown does (calls held open get 0.5 s).
    guard = threading.Timer(1.8, os._exit, (0,))
    guard.daemon = True
    guard.start()
    try:
        await asyncio.wait_for(asyncio.gather(*(s.stop_async(0.5) for s in servers)), 1.5)
    except asyncio.TimeoutError:
        print("server: shutdown took over 1.5 s", file=sys.stderr)
    guard.cancel()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", action="append", required=True, metavar="ADDR")
    ap.add_argument("--tls-cert", metavar="FILE", help="certificate chain (PEM) for TLS")
    ap.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    a = ap.parse_args()
    if (a.tls_cert is None) != (a.tls_key is None):
        ap.error("--tls-cert and --tls-key go together")
    tls = None if a.tls_cert is None else topspin.ServerTls(a.tls_cert, a.tls_key)
    common.setup_tracing()
    try:
        asyncio.run(serve(a.listen, tls))
    except RuntimeError as e:  # a bind that failed
        print(f"server: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
