"""The matrix checks with the asyncio client (`topspin.AsyncChannel`), in the README's order.

Each check raises `common.Failed` (or any exception) when it does not pass; the driver
(client.py) gives each its own deadline (`asyncio.wait_for`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable, Coroutine, Optional

import matrix_pb2 as pb
import matrix_topspin as rpc
from common import (
    COMPRESSIBLE,
    DETAILS,
    ECHO_BIN,
    LARGE,
    Failed,
    expect,
    first,
    one_line,
    trace_id_hex,
)
from opentelemetry import trace as otel_trace

import topspin
import topspin.otel

T = 5.0  # every call's own deadline, unless the check says otherwise


class Checks:
    def __init__(self, target: str, tag: Callable[[str], str], ca: Optional[str] = None) -> None:
        self.target = target
        self.tag = tag
        self.ca = ca  # the CAs (PEM file) a tls:// or wss:// server's certificate chains to
        self.channel = topspin.AsyncChannel(target, ca_pem=ca)
        self.c = rpc.MatrixAsyncClient(self.channel)

    async def was_cancelled(self, t: str) -> None:
        """`WasCancelled(t)` turns true within 3 s (polled every 50 ms)."""
        end = time.monotonic() + 3.0
        while not (await self.c.WasCancelled(pb.Tag(tag=t), timeout=T)).value:
            expect(time.monotonic() < end, f"WasCancelled({t}) still false after 3 s")
            await asyncio.sleep(0.05)

    async def unary(self) -> None:
        md: topspin.Metadata = [("x-echo", "v1"), ("x-echo-bin", ECHO_BIN)]
        r, info = await self.c.Unary.with_call(pb.Msg(payload=b"hello"), timeout=T, metadata=md)
        expect(r.payload == b"hello", f"payload {r.payload!r}")
        expect(first(info.headers, "x-echo") == "v1", f"headers {info.headers!r}")
        expect(first(info.headers, "x-echo-bin") == ECHO_BIN, f"headers {info.headers!r}")
        expect(first(info.trailers, "x-echo-t") == "v1", f"trailers {info.trailers!r}")

    async def large(self) -> None:
        r = await self.c.Unary(pb.Msg(payload=LARGE), timeout=T)
        expect(r.payload == LARGE, f"{len(r.payload)} bytes back, not the {len(LARGE)} sent")

    async def server_stream(self) -> None:
        s = self.c.ServerStream(pb.StreamReq(count=5, size=10), timeout=T)
        got = [m.payload async for m in s]
        expect(got == [b"a" * 10] * 5, f"got {got!r}")

    async def quiet_stream(self) -> None:
        t = self.tag("quiet-stream")
        t0 = time.monotonic()
        # Not awaited: the call is handed back at once. No call deadline: only the cancel
        # may end it (the check's own deadline bounds it).
        s = self.c.ServerStream(pb.StreamReq(hold=True, tag=t))
        took = time.monotonic() - t0
        expect(took < 1.0, f"the call was handed back after {took:.2f} s")
        reader = asyncio.ensure_future(s.__anext__())  # waiting for a message meanwhile
        await asyncio.sleep(0.2)
        expect(not reader.done(), "the quiet stream ended or answered before the cancel")
        s.cancel()
        try:
            m = await asyncio.wait_for(reader, 1.0)
            raise Failed(f"after the cancel the reader got {m!r}")
        except asyncio.TimeoutError:
            raise Failed("the cancel did not wake the reader within 1 s") from None
        except topspin.StatusError as e:
            expect(e.code == topspin.Code.CANCELLED, f"after the cancel the reader got {e!r}")
        except StopAsyncIteration:
            raise Failed("after the cancel the stream ended OK") from None
        await self.was_cancelled(t)

    async def client_stream(self) -> None:
        async def msgs() -> AsyncIterator[pb.Msg]:
            for n in (1, 2, 3):
                yield pb.Msg(payload=b"x" * n)

        r = await self.c.ClientStream(msgs(), timeout=T)
        expect((r.count, r.bytes) == (3, 6), f"Summary(count {r.count}, bytes {r.bytes})")

    async def bidi_open_then_send(self) -> None:
        q: "asyncio.Queue[Optional[pb.Msg]]" = asyncio.Queue()

        async def requests() -> AsyncIterator[pb.Msg]:
            while (m := await q.get()) is not None:
                yield m

        t0 = time.monotonic()
        s = self.c.Bidi(requests(), timeout=T)  # not awaited; nothing sent yet
        took = time.monotonic() - t0
        expect(took < 1.0, f"the call was handed back after {took:.2f} s")
        try:
            for p in (b"a", b"b"):
                q.put_nowait(pb.Msg(payload=p))
                r = await s.__anext__()
                expect(r.payload == p, f"sent {p!r}, received {r.payload!r}")
            q.put_nowait(None)
            rest = [m async for m in s]
            expect(rest == [], f"{len(rest)} more messages after the request stream ended")
        finally:
            s.cancel()  # no-op once the call ended; stops the sending task otherwise

    async def deadline(self) -> None:
        t = self.tag("deadline")
        t0 = time.monotonic()
        try:
            await self.c.Sleep(pb.SleepReq(millis=2000, tag=t), timeout=0.2)
            raise Failed("Sleep(2000 ms) with a 200 ms deadline answered")
        except topspin.StatusError as e:
            took = time.monotonic() - t0
            expect(e.code == topspin.Code.DEADLINE_EXCEEDED, f"status {one_line(e)}")
            expect(took < 1.5, f"DEADLINE_EXCEEDED after {took:.2f} s")
        await self.was_cancelled(t)

    async def cancel(self) -> None:
        """Cancelling the call's task cancels the call; asyncio shows it as CancelledError."""
        t = self.tag("cancel")
        call = asyncio.ensure_future(self.c.Sleep(pb.SleepReq(millis=10000, tag=t), timeout=15))
        await asyncio.sleep(0.2)
        expect(not call.done(), "Sleep(10000 ms) ended before the cancel")
        call.cancel()
        try:
            await asyncio.wait_for(call, 1.0)
            raise Failed("Sleep(10000 ms) answered")
        except asyncio.CancelledError:
            pass
        except topspin.StatusError as e:
            expect(e.code == topspin.Code.CANCELLED, f"status {one_line(e)}")
        await self.was_cancelled(t)

    async def error_details(self) -> None:
        try:
            await self.c.Fail(pb.FailReq(code=5, message="nope", details=DETAILS), timeout=T)
            raise Failed("Fail answered")
        except topspin.StatusError as e:
            expect(e.code == topspin.Code.NOT_FOUND, f"status {one_line(e)}")
            expect(e.message == "nope", f"message {e.message!r}")
            expect(e.details == DETAILS, f"details {e.details.hex()}")
            # The handler's response header came before the error and stays with it (§5.4).
            h = dict(e.headers).get("x-fail-h")
            expect(h == "v1", f"header x-fail-h {h!r} (headers {e.headers}, trailers {e.trailers})")

    async def compression(self) -> None:
        """One channel per algorithm: the API sets request compression per channel."""
        for algo in ("gzip", "zstd"):
            async with topspin.AsyncChannel(self.target, compression=algo, ca_pem=self.ca) as ch:
                c = rpc.MatrixAsyncClient(ch)
                r = await c.Unary(pb.Msg(payload=COMPRESSIBLE), timeout=T)
                expect(r.payload == COMPRESSIBLE, f"{algo}: {len(r.payload)} bytes back")

    async def trace(self) -> None:
        """A root span of the global (SDK) tracer provider; with it current, `Unary` through
        topspin.otel's asyncio client interceptor, which sends its trace context."""
        interceptors = topspin.otel.aio_client_interceptors()
        traced = rpc.MatrixAsyncClient(topspin.intercept_channel(self.channel, *interceptors))
        with otel_trace.get_tracer("matrix-client").start_as_current_span("trace") as root:
            want = root.get_span_context()
            expect(want.is_valid, "no SDK tracer provider: the root span is not recording")
            r, info = await traced.Unary.with_call(pb.Msg(payload=b"trace"), timeout=T)
        expect(r.payload == b"trace", f"payload {r.payload!r}")
        got = first(info.headers, "x-trace-id")
        want_hex = trace_id_hex(want.trace_id)
        expect(got == want_hex, f"x-trace-id {got!r}, the root span's trace is {want_hex}")


def check(checks: Checks, name: str) -> Callable[[], Coroutine[Any, Any, None]]:
    fn: Callable[[], Coroutine[Any, Any, None]] = getattr(checks, name.replace("-", "_"))
    return fn
