"""Server interceptors shaped as grpcio's: `ServerInterceptor.intercept_service(continuation,
handler_call_details)` returns the `RpcMethodHandler` to run (the one `continuation` gives,
a wrapper of it, or one that aborts); `topspin.aio.ServerInterceptor` is the `async def` one."""

from __future__ import annotations

import abc
import inspect
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
)

from . import _native
from ._errors import Code, MetadataValue, StatusError
from ._server import MethodHandler, ServicerContext, _fail, _is_async, _run_async, _run_sync

if TYPE_CHECKING:
    from ._server import Server


class HandlerCallDetails(NamedTuple):
    """The call an interceptor sees: `method` ("/pkg.Service/Method") and the request
    metadata (a list of `(key, value)` pairs)."""

    method: str
    invocation_metadata: List[Tuple[str, MetadataValue]]


class RpcMethodHandler(NamedTuple):
    """How to run one method (grpcio's shape): the behaviour of its kind, `(request, context)`,
    `def` or `async def`. `request_deserializer` None: the method's own message type;
    responses are encoded with their `SerializeToString` (`response_serializer` is not used)."""

    request_streaming: bool
    response_streaming: bool
    request_deserializer: Optional[Callable[[bytes], Any]]
    response_serializer: Optional[Callable[[Any], bytes]]
    unary_unary: Optional[Callable[..., Any]]
    unary_stream: Optional[Callable[..., Any]]
    stream_unary: Optional[Callable[..., Any]]
    stream_stream: Optional[Callable[..., Any]]


_Ser = Optional[Callable[[Any], bytes]]
_De = Optional[Callable[[bytes], Any]]


def unary_unary_rpc_method_handler(
    behavior: Callable[..., Any], request_deserializer: _De = None, response_serializer: _Ser = None
) -> RpcMethodHandler:
    h = (behavior, None, None, None)
    return RpcMethodHandler(False, False, request_deserializer, response_serializer, *h)


def unary_stream_rpc_method_handler(
    behavior: Callable[..., Any], request_deserializer: _De = None, response_serializer: _Ser = None
) -> RpcMethodHandler:
    h = (None, behavior, None, None)
    return RpcMethodHandler(False, True, request_deserializer, response_serializer, *h)


def stream_unary_rpc_method_handler(
    behavior: Callable[..., Any], request_deserializer: _De = None, response_serializer: _Ser = None
) -> RpcMethodHandler:
    h = (None, None, behavior, None)
    return RpcMethodHandler(True, False, request_deserializer, response_serializer, *h)


def stream_stream_rpc_method_handler(
    behavior: Callable[..., Any], request_deserializer: _De = None, response_serializer: _Ser = None
) -> RpcMethodHandler:
    h = (None, None, None, behavior)
    return RpcMethodHandler(True, True, request_deserializer, response_serializer, *h)


Continuation = Callable[[HandlerCallDetails], Optional[RpcMethodHandler]]
AsyncContinuation = Callable[[HandlerCallDetails], Awaitable[Optional[RpcMethodHandler]]]


class ServerInterceptor(abc.ABC):
    """Sees every call before its handler runs (on the server's event-loop thread: keep it
    quick; the handler it returns runs as the method's own would)."""

    @abc.abstractmethod
    def intercept_service(
        self, continuation: Continuation, handler_call_details: HandlerCallDetails
    ) -> Optional[RpcMethodHandler]:
        """Returns `continuation(handler_call_details)`, a wrapper of it, or another handler
        (None: UNIMPLEMENTED)."""


class AsyncServerInterceptor(abc.ABC):
    """`topspin.aio.ServerInterceptor`: `async def intercept_service`, awaiting `continuation`."""

    @abc.abstractmethod
    async def intercept_service(
        self, continuation: AsyncContinuation, handler_call_details: HandlerCallDetails
    ) -> Optional[RpcMethodHandler]:
        """Returns `await continuation(handler_call_details)`, a wrapper, or another handler."""


_FIELD = {
    "unary": "unary_unary",
    "server_streaming": "unary_stream",
    "client_streaming": "stream_unary",
    "streaming": "stream_stream",
}
_KIND = {
    (False, False): "unary",
    (False, True): "server_streaming",
    (True, False): "client_streaming",
    (True, True): "streaming",
}


def check(interceptors: Sequence[Any]) -> bool:
    """Whether the interceptors are `async def` ones; all must be of one sort."""
    sorts = {
        inspect.iscoroutinefunction(getattr(i, "intercept_service", None)) for i in interceptors
    }
    for i in interceptors:
        if not callable(getattr(i, "intercept_service", None)):
            raise TypeError(f"{i!r} has no intercept_service")
    if len(sorts) > 1:
        raise ValueError("server interceptors must be all `def` or all `async def` ones")
    return sorts == {True}


def rpc_handler(m: MethodHandler) -> RpcMethodHandler:
    """The handler `continuation` gives for a registered method."""
    streams = {v: k for k, v in _KIND.items()}[m.kind]
    fields = {f: (m.handler if k == m.kind else None) for k, f in _FIELD.items()}
    return RpcMethodHandler(
        streams[0],
        streams[1],
        m.request_type.FromString,
        m.response_type.SerializeToString,
        fields["unary_unary"],
        fields["unary_stream"],
        fields["stream_unary"],
        fields["stream_stream"],
    )


class _Decoder:
    def __init__(self, fn: Callable[[bytes], Any]) -> None:
        self.FromString = fn


def _mismatch(behavior: Callable[..., Any], kind: str, want: str) -> Callable[..., Any]:
    # A handler of another kind (typically one that only aborts): run it without the request;
    # if it does not end the call with a status, the call fails.
    err = StatusError(Code.INTERNAL, f"an interceptor gave a {kind} handler for a {want} method")
    if _is_async(behavior):

        async def run_async(_req: Any, ctx: ServicerContext) -> Any:
            await behavior(None, ctx)
            raise err

        return run_async

    def run(_req: Any, ctx: ServicerContext) -> Any:
        behavior(None, ctx)
        raise err

    return run


def resolve(m: MethodHandler, h: Optional[RpcMethodHandler]) -> MethodHandler:
    """What the runner executes for the handler the interceptors gave."""
    if h is None:

        def unimplemented(_req: Any, _ctx: ServicerContext) -> Any:
            raise StatusError(Code.UNIMPLEMENTED, f"no handler for {m.name}")

        return m._replace(handler=_mismatch(unimplemented, "no", m.kind))
    kind = _KIND[(bool(h.request_streaming), bool(h.response_streaming))]
    behavior = getattr(h, _FIELD[kind])
    if behavior is None:
        raise StatusError(Code.INTERNAL, f"the {kind} handler of {m.name} has no behaviour")
    if kind != m.kind:
        behavior = _mismatch(behavior, kind, m.kind)
    de = h.request_deserializer or m.request_type.FromString
    return m._replace(handler=behavior, request_type=_Decoder(de))


def _chain(interceptors: Sequence[Any], last: Callable[[HandlerCallDetails], Any]) -> Any:
    fn = last
    for i in reversed(interceptors):
        fn = _bind(i.intercept_service, fn)
    return fn


def _bind(intercept: Callable[..., Any], nxt: Callable[..., Any]) -> Callable[..., Any]:
    return lambda details: intercept(nxt, details)


def _run(server: "Server", m: MethodHandler, call: _native.ServerCall) -> None:
    if _is_async(m.handler):
        assert server._loop is not None
        t = server._loop.create_task(_run_async(m, call, server._tasks))
        if not t.done():
            server._tasks[call.id] = t
    else:
        assert server._pool is not None
        server._pool.submit(_run_sync, m, call)


async def _through_async(server: "Server", m: MethodHandler, call: _native.ServerCall) -> None:
    async def last(_d: HandlerCallDetails) -> RpcMethodHandler:
        return rpc_handler(m)

    try:
        details = HandlerCallDetails(m.name, call.metadata())
        m2 = resolve(m, await _chain(server._interceptors, last)(details))
    except BaseException as e:  # noqa: BLE001 - ends only this call
        server._tasks.pop(call.id, None)
        _fail(call, e, ServicerContext(call, m.name))
        return
    if _is_async(m2.handler):
        await _run_async(m2, call, server._tasks)
    else:
        server._tasks.pop(call.id, None)
        assert server._pool is not None
        server._pool.submit(_run_sync, m2, call)


def dispatch(server: "Server", m: MethodHandler, call: _native.ServerCall) -> None:
    """Runs a call through the server's interceptors, then its handler (on the loop)."""
    if server._interceptors_async:
        assert server._loop is not None
        t = server._loop.create_task(_through_async(server, m, call))
        if not t.done():
            server._tasks[call.id] = t
        return
    try:
        details = HandlerCallDetails(m.name, call.metadata())
        m2 = resolve(m, _chain(server._interceptors, lambda _d: rpc_handler(m))(details))
    except BaseException as e:  # noqa: BLE001 - ends only this call
        _fail(call, e, ServicerContext(call, m.name))
        return
    _run(server, m2, call)
