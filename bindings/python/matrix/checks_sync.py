"""The matrix checks with the blocking client (`topspin.Channel`), in the README's order.

Each check raises `common.Failed` (or any exception) when it does not pass. The driver
(client.py) runs them on the main thread: a blocking call there can be interrupted by a
signal (SIGALRM is each check's deadline; SIGINT is how the blocking API cancels a call)."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from typing import Any, Callable, Iterator, Optional

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


def next_or_error(s: Iterator[Any]) -> object:
    """The stream's next message, or what it raised instead."""
    try:
        return next(s)
    except BaseException as e:  # noqa: BLE001 - the caller looks at it
        return e


class Checks:
    def __init__(self, target: str, tag: Callable[[str], str], ca: Optional[str] = None) -> None:
        self.target = target
        self.tag = tag
        self.ca = ca  # the CAs (PEM file) a tls:// or wss:// server's certificate chains to
        self.channel = topspin.Channel(target, ca_pem=ca)
        self.c = rpc.MatrixClient(self.channel)

    def was_cancelled(self, t: str) -> None:
        """`WasCancelled(t)` turns true within 3 s (polled every 50 ms)."""
        end = time.monotonic() + 3.0
        while not self.c.WasCancelled(pb.Tag(tag=t), timeout=T).value:
            expect(time.monotonic() < end, f"WasCancelled({t}) still false after 3 s")
            time.sleep(0.05)

    def unary(self) -> None:
        md: topspin.Metadata = [("x-echo", "v1"), ("x-echo-bin", ECHO_BIN)]
        r, info = self.c.Unary.with_call(pb.Msg(payload=b"hello"), timeout=T, metadata=md)
        expect(r.payload == b"hello", f"payload {r.payload!r}")
        expect(first(info.headers, "x-echo") == "v1", f"headers {info.headers!r}")
        expect(first(info.headers, "x-echo-bin") == ECHO_BIN, f"headers {info.headers!r}")
        expect(first(info.trailers, "x-echo-t") == "v1", f"trailers {info.trailers!r}")

    def large(self) -> None:
        r = self.c.Unary(pb.Msg(payload=LARGE), timeout=T)
        expect(r.payload == LARGE, f"{len(r.payload)} bytes back, not the {len(LARGE)} sent")

    def server_stream(self) -> None:
        got = [m.payload for m in self.c.ServerStream(pb.StreamReq(count=5, size=10), timeout=T)]
        expect(got == [b"a" * 10] * 5, f"got {got!r}")

    def quiet_stream(self) -> None:
        t = self.tag("quiet-stream")
        t0 = time.monotonic()
        # No call deadline: only the cancel may end it (the check's own deadline bounds it).
        s = self.c.ServerStream(pb.StreamReq(hold=True, tag=t))
        took = time.monotonic() - t0
        expect(took < 1.0, f"the call was handed back after {took:.2f} s")
        got: list[object] = []  # what a reader waiting for a message meanwhile gets
        reader = threading.Thread(target=lambda: got.append(next_or_error(s)), daemon=True)
        reader.start()
        time.sleep(0.2)
        expect(reader.is_alive(), f"the quiet stream gave {got!r} before the cancel")
        s.cancel()
        reader.join(1.0)
        expect(not reader.is_alive(), "the cancel did not wake the reader within 1 s")
        e = got[0]
        cancelled = isinstance(e, topspin.StatusError) and e.code == topspin.Code.CANCELLED
        expect(cancelled, f"after the cancel the reader got {e!r}")
        self.was_cancelled(t)

    def client_stream(self) -> None:
        msgs = (pb.Msg(payload=b"x" * n) for n in (1, 2, 3))
        r = self.c.ClientStream(msgs, timeout=T)
        expect((r.count, r.bytes) == (3, 6), f"Summary(count {r.count}, bytes {r.bytes})")

    def bidi_open_then_send(self) -> None:
        q: "queue.Queue[Optional[pb.Msg]]" = queue.Queue()

        def requests() -> Iterator[pb.Msg]:
            while (m := q.get()) is not None:
                yield m

        try:
            t0 = time.monotonic()
            s = self.c.Bidi(requests(), timeout=T)  # nothing sent yet
            took = time.monotonic() - t0
            expect(took < 1.0, f"the call was handed back after {took:.2f} s")
            for p in (b"a", b"b"):
                q.put(pb.Msg(payload=p))
                r = next(s, None)
                expect(r is not None and r.payload == p, f"sent {p!r}, received {r!r}")
            q.put(None)
            rest = list(s)
            expect(rest == [], f"{len(rest)} more messages after the request stream ended")
        finally:
            q.put(None)  # the sending thread ends

    def deadline(self) -> None:
        t = self.tag("deadline")
        t0 = time.monotonic()
        try:
            self.c.Sleep(pb.SleepReq(millis=2000, tag=t), timeout=0.2)
            raise Failed("Sleep(2000 ms) with a 200 ms deadline answered")
        except topspin.StatusError as e:
            took = time.monotonic() - t0
            expect(e.code == topspin.Code.DEADLINE_EXCEEDED, f"status {one_line(e)}")
            expect(took < 1.5, f"DEADLINE_EXCEEDED after {took:.2f} s")
        self.was_cancelled(t)

    def cancel(self) -> None:
        """The blocking API cancels a call on Ctrl-C (SIGINT), which it raises as
        KeyboardInterrupt: that is where it shows the cancellation."""
        t = self.tag("cancel")
        old = signal.signal(signal.SIGINT, signal.default_int_handler)
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        t0 = time.monotonic()
        try:
            timer.start()
            self.c.Sleep(pb.SleepReq(millis=10000, tag=t), timeout=15)
            raise Failed("Sleep(10000 ms) answered")
        except KeyboardInterrupt:
            took = time.monotonic() - t0
            expect(took < 1.0, f"the cancelled call returned after {took:.2f} s")
        finally:
            timer.cancel()
            signal.signal(signal.SIGINT, old)
        self.was_cancelled(t)

    def error_details(self) -> None:
        try:
            self.c.Fail(pb.FailReq(code=5, message="nope", details=DETAILS), timeout=T)
            raise Failed("Fail answered")
        except topspin.StatusError as e:
            expect(e.code == topspin.Code.NOT_FOUND, f"status {one_line(e)}")
            expect(e.message == "nope", f"message {e.message!r}")
            expect(e.details == DETAILS, f"details {e.details.hex()}")
            # The handler's response header came before the error and stays with it (§5.4).
            h = dict(e.headers).get("x-fail-h")
            expect(h == "v1", f"header x-fail-h {h!r} (headers {e.headers}, trailers {e.trailers})")

    def compression(self) -> None:
        """One channel per algorithm: the API sets request compression per channel."""
        for algo in ("gzip", "zstd"):
            with topspin.Channel(self.target, compression=algo, ca_pem=self.ca) as ch:
                r = rpc.MatrixClient(ch).Unary(pb.Msg(payload=COMPRESSIBLE), timeout=T)
                expect(r.payload == COMPRESSIBLE, f"{algo}: {len(r.payload)} bytes back")

    def trace(self) -> None:
        """A root span of the global (SDK) tracer provider; with it current, `Unary` through
        topspin.otel's client interceptor, which sends its trace context."""
        traced = rpc.MatrixClient(
            topspin.intercept_channel(self.channel, topspin.otel.client_interceptor())
        )
        with otel_trace.get_tracer("matrix-client").start_as_current_span("trace") as root:
            want = root.get_span_context()
            expect(want.is_valid, "no SDK tracer provider: the root span is not recording")
            r, info = traced.Unary.with_call(pb.Msg(payload=b"trace"), timeout=T)
        expect(r.payload == b"trace", f"payload {r.payload!r}")
        got = first(info.headers, "x-trace-id")
        want_hex = trace_id_hex(want.trace_id)
        expect(got == want_hex, f"x-trace-id {got!r}, the root span's trace is {want_hex}")


def check(checks: Checks, name: str) -> Callable[[], Any]:
    fn: Callable[[], Any] = getattr(checks, name.replace("-", "_"))
    return fn
