"""OpenTelemetry for topspin calls, shaped as `opentelemetry-instrumentation-grpc`: interceptors
that give each call a span and a duration measurement, and carry the W3C trace context.

Needs `opentelemetry-api` (`pip install topspin-rpc[otel]`); the SDK, exporters and propagators are
the application's choice. The propagator is the global one (`opentelemetry.propagate`; by
default W3C `traceparent`/`tracestate` and baggage).

- Blocking client: `topspin.intercept_channel(channel, topspin.otel.client_interceptor())`.
- asyncio client: `topspin.AsyncChannel(address,
  interceptors=topspin.otel.aio_client_interceptors())`.
- Server: `topspin.Server(interceptors=[topspin.otel.server_interceptor()])` (`def` and
  `async def` handlers alike), or `aio_server_interceptor()` among `async def` interceptors.

Each call gets a span named `package.Service/Method`, of kind CLIENT or SERVER, with the
attributes `rpc.system` (`"topspin"`), `rpc.service`, `rpc.method` and `rpc.grpc.status_code`
(topspin's codes are gRPC's); a call that ends with another code than OK gets the status ERROR
(on both sides, as the Rust implementation). The client writes its span's context into the
request metadata (replacing any `traceparent`/`tracestate` there); the server makes the context
it reads from the metadata its span's parent and runs the handler with its span current. The
histograms `rpc.client.duration` and `rpc.server.duration` (milliseconds) get one measurement
per call with the same attributes. A streaming call's span ends when its stream does (the
client's when the responses have been read to their end, or the call is cancelled).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from contextvars import Token
from typing import (
    Any,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Tuple,
    Union,
)

from google.protobuf.message import Message
from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import _aio_interceptors as aio_ic
from . import _interceptors as ic
from ._errors import Code, StatusError
from ._server import ServicerContext, _is_async
from ._server_interceptors import (
    AsyncContinuation,
    AsyncServerInterceptor,
    Continuation,
    HandlerCallDetails,
    RpcMethodHandler,
)
from ._server_interceptors import ServerInterceptor as _SyncServerInterceptor

__all__ = [
    "AioClientInterceptor",
    "AioServerInterceptor",
    "ClientInterceptor",
    "ServerInterceptor",
    "aio_client_interceptors",
    "aio_server_interceptor",
    "client_interceptor",
    "server_interceptor",
]

_NAME = "topspin.otel"
RPC_SYSTEM = "topspin"


def _code_of(err: Optional[BaseException], server: bool) -> Tuple[Code, str]:
    if err is None:
        return Code.OK, ""
    if isinstance(err, StatusError):
        return err.code, err.message
    if isinstance(err, (asyncio.CancelledError, GeneratorExit)):
        return Code.CANCELLED, "cancelled"
    # What the server answers for any other exception; on a client, a call that failed so.
    return (Code.INTERNAL if server else Code.UNKNOWN), f"{type(err).__name__}: {err}"


class _Telemetry:
    """The tracer and histogram of one side."""

    def __init__(
        self,
        kind: SpanKind,
        tracer_provider: Optional[trace.TracerProvider],
        meter_provider: Optional[metrics.MeterProvider],
    ) -> None:
        self.kind = kind
        self.tracer = trace.get_tracer(_NAME, None, tracer_provider)
        meter = metrics.get_meter(_NAME, "", meter_provider)
        side = "client" if kind == SpanKind.CLIENT else "server"
        self.duration = meter.create_histogram(
            f"rpc.{side}.duration",
            unit="ms",
            description=f"Duration of {'outgoing' if side == 'client' else 'incoming'} calls",
        )

    def start(self, method: str, parent: otel_context.Context) -> "_Call":
        return _Call(self, method, parent)


class _Call:
    """One call's span and its start; `end(err)` records how it ended (once)."""

    def __init__(self, t: _Telemetry, method: str, parent: otel_context.Context) -> None:
        self.t = t
        name = method.lstrip("/")
        service, _, rpc_method = name.partition("/")
        self.attrs: Dict[str, Any] = {
            "rpc.system": RPC_SYSTEM,
            "rpc.service": service,
            "rpc.method": rpc_method,
        }
        self.span = t.tracer.start_span(name, context=parent, kind=t.kind, attributes=self.attrs)
        self.context = trace.set_span_in_context(self.span, parent)
        self.t0 = time.monotonic()
        self._ended = False
        self._lock = threading.Lock()

    def attach(self) -> Token[otel_context.Context]:
        return otel_context.attach(self.context)

    def end(self, err: Optional[BaseException]) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        ms = (time.monotonic() - self.t0) * 1000.0
        server = self.t.kind == SpanKind.SERVER
        code, message = _code_of(err, server)
        self.span.set_attribute("rpc.grpc.status_code", int(code))
        if code != Code.OK:
            self.span.set_status(Status(StatusCode.ERROR, f"{code.name}: {message}"))
        if err is not None and not isinstance(
            err, (StatusError, asyncio.CancelledError, GeneratorExit)
        ):
            self.span.record_exception(err)
        self.span.end()
        self.t.duration.record(ms, {**self.attrs, "rpc.grpc.status_code": int(code)})


# --- clients -----------------------------------------------------------------------------


def _start_client(t: _Telemetry, d: ic.ClientCallDetails) -> Tuple[_Call, ic.ClientCallDetails]:
    call = t.start(ic._method_of(d), otel_context.get_current())
    carrier: Dict[str, str] = {}
    propagate.inject(carrier, context=call.context)
    keys = {k.lower() for k in carrier}
    md = [(k, v) for k, v in (d.metadata or []) if k.lower() not in keys]
    md += list(carrier.items())
    return call, d._replace(metadata=md)


def _iterate(it: Iterable[Any], call: _Call) -> Iterator[Any]:
    try:
        yield from it
    except BaseException as e:
        call.end(e)
        raise
    call.end(None)


async def _aiterate(it: AsyncIterable[Any], call: _Call) -> AsyncIterator[Any]:
    try:
        async for r in it:
            yield r
    except BaseException as e:
        call.end(e)
        raise
    call.end(None)


class ClientInterceptor(
    ic.UnaryUnaryClientInterceptor,
    ic.UnaryStreamClientInterceptor,
    ic.StreamUnaryClientInterceptor,
    ic.StreamStreamClientInterceptor,
):
    """The blocking client's interceptor (all four kinds of call): see the module's doc."""

    def __init__(
        self,
        tracer_provider: Optional[trace.TracerProvider] = None,
        meter_provider: Optional[metrics.MeterProvider] = None,
    ) -> None:
        self._t = _Telemetry(SpanKind.CLIENT, tracer_provider, meter_provider)

    def _unary(self, continuation: Callable[..., Any], d: ic.ClientCallDetails, req: Any) -> Any:
        call, d = _start_client(self._t, d)
        token = call.attach()
        try:
            out = continuation(d, req)
        except BaseException as e:
            call.end(e)
            raise
        finally:
            otel_context.detach(token)
        call.end(out.exception())
        return out

    def _stream(self, continuation: Callable[..., Any], d: ic.ClientCallDetails, req: Any) -> Any:
        call, d = _start_client(self._t, d)
        token = call.attach()
        try:
            out = continuation(d, req)
        except BaseException as e:
            call.end(e)
            raise
        finally:
            otel_context.detach(token)
        if isinstance(out, ic.StreamCall):
            out.add_done_callback(lambda c: call.end(c.exception()))
            return out
        return _iterate(out, call)

    def intercept_unary_unary(
        self,
        continuation: Callable[[ic.ClientCallDetails, Any], ic.UnaryOutcome],
        client_call_details: ic.ClientCallDetails,
        request: Any,
    ) -> ic.UnaryOutcome:
        out: ic.UnaryOutcome = self._unary(continuation, client_call_details, request)
        return out

    def intercept_stream_unary(
        self,
        continuation: Callable[[ic.ClientCallDetails, Iterator[Any]], ic.UnaryOutcome],
        client_call_details: ic.ClientCallDetails,
        request_iterator: Iterator[Any],
    ) -> ic.UnaryOutcome:
        out: ic.UnaryOutcome = self._unary(continuation, client_call_details, request_iterator)
        return out

    def intercept_unary_stream(
        self,
        continuation: Callable[[ic.ClientCallDetails, Any], ic.StreamCall],
        client_call_details: ic.ClientCallDetails,
        request: Any,
    ) -> Iterator[Any]:
        out: Iterator[Any] = self._stream(continuation, client_call_details, request)
        return out

    def intercept_stream_stream(
        self,
        continuation: Callable[[ic.ClientCallDetails, Iterator[Any]], ic.StreamCall],
        client_call_details: ic.ClientCallDetails,
        request_iterator: Iterator[Any],
    ) -> Iterator[Any]:
        out: Iterator[Any] = self._stream(continuation, client_call_details, request_iterator)
        return out


class AioClientInterceptor(
    aio_ic.UnaryUnaryClientInterceptor,
    aio_ic.UnaryStreamClientInterceptor,
    aio_ic.StreamUnaryClientInterceptor,
    aio_ic.StreamStreamClientInterceptor,
):
    """The asyncio client's interceptor (all four kinds of call): see the module's doc."""

    def __init__(
        self,
        tracer_provider: Optional[trace.TracerProvider] = None,
        meter_provider: Optional[metrics.MeterProvider] = None,
    ) -> None:
        self._t = _Telemetry(SpanKind.CLIENT, tracer_provider, meter_provider)

    async def _unary(
        self, continuation: Callable[..., Any], d: ic.ClientCallDetails, req: Any
    ) -> Any:
        call, d = _start_client(self._t, d)
        token = call.attach()
        try:
            out = await continuation(d, req)
            if isinstance(out, aio_ic.UnaryCall):
                try:
                    await out  # the call keeps its outcome: the caller awaits it again
                except StatusError as e:
                    call.end(e)
        except BaseException as e:
            call.end(e)
            raise
        finally:
            otel_context.detach(token)
        call.end(None)  # (if not ended above)
        return out

    async def _stream(
        self, continuation: Callable[..., Any], d: ic.ClientCallDetails, req: Any
    ) -> Any:
        call, d = _start_client(self._t, d)
        token = call.attach()
        try:
            out = await continuation(d, req)
        except BaseException as e:
            call.end(e)
            raise
        finally:
            otel_context.detach(token)
        if isinstance(out, aio_ic.StreamCall):
            out.add_done_callback(lambda c: call.end(aio_ic.stream_error(c)))
            return out
        return _aiterate(out, call)

    async def intercept_unary_unary(
        self,
        continuation: aio_ic.UnaryContinuation,
        client_call_details: ic.ClientCallDetails,
        request: Any,
    ) -> Union[aio_ic.UnaryCall, Message]:
        out: Union[aio_ic.UnaryCall, Message] = await self._unary(
            continuation, client_call_details, request
        )
        return out

    async def intercept_stream_unary(
        self,
        continuation: aio_ic.UnaryContinuation,
        client_call_details: ic.ClientCallDetails,
        request_iterator: Any,
    ) -> Union[aio_ic.UnaryCall, Message]:
        out: Union[aio_ic.UnaryCall, Message] = await self._unary(
            continuation, client_call_details, request_iterator
        )
        return out

    async def intercept_unary_stream(
        self,
        continuation: aio_ic.StreamContinuation,
        client_call_details: ic.ClientCallDetails,
        request: Any,
    ) -> Union[aio_ic.StreamCall, AsyncIterable[Any]]:
        out: Union[aio_ic.StreamCall, AsyncIterable[Any]] = await self._stream(
            continuation, client_call_details, request
        )
        return out

    async def intercept_stream_stream(
        self,
        continuation: aio_ic.StreamContinuation,
        client_call_details: ic.ClientCallDetails,
        request_iterator: Any,
    ) -> Union[aio_ic.StreamCall, AsyncIterable[Any]]:
        out: Union[aio_ic.StreamCall, AsyncIterable[Any]] = await self._stream(
            continuation, client_call_details, request_iterator
        )
        return out


# --- servers -----------------------------------------------------------------------------


def _start_server(t: _Telemetry, method: str, ctx: ServicerContext) -> _Call:
    carrier = {k: v for k, v in ctx.invocation_metadata() if isinstance(v, str)}
    # Only the client's context is the parent (none: a new trace), never the thread's.
    parent = propagate.extract(carrier, context=otel_context.Context())
    return t.start(method, parent)


_FIELDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def _wrap(t: _Telemetry, h: Optional[RpcMethodHandler], method: str) -> Optional[RpcMethodHandler]:
    """`h` with its behaviour run in a server span (`def` stays `def`, `async def` async)."""
    if h is None:
        return None
    field = _FIELDS[2 * bool(h.request_streaming) + bool(h.response_streaming)]
    behavior = getattr(h, field)
    if behavior is None:
        return h
    if h.response_streaming:
        make = _stream_async if _is_async(behavior) else _stream_sync
    else:
        make = _unary_async if _is_async(behavior) else _unary_sync
    wrapped = make(t, behavior, method)
    fields: Dict[str, Any] = {field: wrapped}
    return h._replace(**fields)


def _unary_sync(t: _Telemetry, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    def run(request: Any, context: ServicerContext) -> Any:
        call = _start_server(t, method, context)
        token = call.attach()
        try:
            out = behavior(request, context)
        except BaseException as e:
            call.end(e)
            raise
        finally:
            otel_context.detach(token)
        call.end(None)
        return out

    return run


def _unary_async(t: _Telemetry, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    async def run(request: Any, context: ServicerContext) -> Any:
        call = _start_server(t, method, context)
        token = call.attach()
        try:
            out = await behavior(request, context)
        except BaseException as e:
            call.end(e)
            raise
        finally:
            otel_context.detach(token)
        call.end(None)
        return out

    return run


def _stream_sync(t: _Telemetry, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    # The span is current only while the handler's code runs (between its messages the
    # thread sends them), so a stream left unfinished leaves no context attached. No local
    # keeps the exception (a cycle through this frame would keep the call's objects alive).
    def run(request: Any, context: ServicerContext) -> Iterator[Any]:
        call = _start_server(t, method, context)
        it: Optional[Iterator[Any]] = None
        try:
            token = call.attach()
            try:
                it = iter(behavior(request, context))
            finally:
                otel_context.detach(token)
            while True:
                token = call.attach()
                try:
                    r = next(it)
                except StopIteration:
                    break
                finally:
                    otel_context.detach(token)
                yield r
        except BaseException as e:
            close = getattr(it, "close", None)
            if close is not None:
                token = call.attach()
                try:
                    close()
                finally:
                    otel_context.detach(token)
            call.end(e)
            raise
        call.end(None)

    return run


def _stream_async(t: _Telemetry, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    async def run(request: Any, context: ServicerContext) -> AsyncIterator[Any]:
        call = _start_server(t, method, context)
        it: Any = None
        try:
            token = call.attach()
            try:
                out = behavior(request, context)
                if inspect.isawaitable(out):
                    out = await out
                it = out.__aiter__()
            finally:
                otel_context.detach(token)
            while True:
                token = call.attach()
                try:
                    r = await it.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    otel_context.detach(token)
                yield r
        except BaseException as e:
            aclose = getattr(it, "aclose", None)
            if aclose is not None:
                token = call.attach()
                try:
                    await aclose()
                finally:
                    otel_context.detach(token)
            call.end(e)
            raise
        call.end(None)

    return run


class ServerInterceptor(_SyncServerInterceptor):
    """The server interceptor (`def`): see the module's doc."""

    def __init__(
        self,
        tracer_provider: Optional[trace.TracerProvider] = None,
        meter_provider: Optional[metrics.MeterProvider] = None,
    ) -> None:
        self._t = _Telemetry(SpanKind.SERVER, tracer_provider, meter_provider)

    def intercept_service(
        self, continuation: Continuation, handler_call_details: HandlerCallDetails
    ) -> Optional[RpcMethodHandler]:
        return _wrap(self._t, continuation(handler_call_details), handler_call_details.method)


class AioServerInterceptor(AsyncServerInterceptor):
    """The server interceptor for servers whose interceptors are `async def` ones."""

    def __init__(
        self,
        tracer_provider: Optional[trace.TracerProvider] = None,
        meter_provider: Optional[metrics.MeterProvider] = None,
    ) -> None:
        self._t = _Telemetry(SpanKind.SERVER, tracer_provider, meter_provider)

    async def intercept_service(
        self, continuation: AsyncContinuation, handler_call_details: HandlerCallDetails
    ) -> Optional[RpcMethodHandler]:
        h = await continuation(handler_call_details)
        return _wrap(self._t, h, handler_call_details.method)


# The public names, as opentelemetry-instrumentation-grpc's functions.


def client_interceptor(
    tracer_provider: Optional[trace.TracerProvider] = None,
    meter_provider: Optional[metrics.MeterProvider] = None,
) -> ClientInterceptor:
    """The blocking client's interceptor, for `topspin.intercept_channel(channel, it)`.
    Without providers, the global ones (`opentelemetry.trace`/`metrics`)."""
    return ClientInterceptor(tracer_provider, meter_provider)


def aio_client_interceptors(
    tracer_provider: Optional[trace.TracerProvider] = None,
    meter_provider: Optional[metrics.MeterProvider] = None,
) -> List[AioClientInterceptor]:
    """The asyncio client's interceptors, for `AsyncChannel(address, interceptors=...)`."""
    return [AioClientInterceptor(tracer_provider, meter_provider)]


def server_interceptor(
    tracer_provider: Optional[trace.TracerProvider] = None,
    meter_provider: Optional[metrics.MeterProvider] = None,
) -> ServerInterceptor:
    """The server interceptor (`def`; for `def` and `async def` handlers alike), for
    `topspin.Server(interceptors=[it])`."""
    return ServerInterceptor(tracer_provider, meter_provider)


def aio_server_interceptor(
    tracer_provider: Optional[trace.TracerProvider] = None,
    meter_provider: Optional[metrics.MeterProvider] = None,
) -> AioServerInterceptor:
    """The server interceptor as an `async def` one (`topspin.aio.ServerInterceptor`), for a
    server whose other interceptors are `async def` ones."""
    return AioServerInterceptor(tracer_provider, meter_provider)
