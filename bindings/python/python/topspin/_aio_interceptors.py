"""Client interceptors for `AsyncChannel`, shaped as grpc.aio's (`topspin.aio.*`): `async def
intercept_unary_unary(continuation, client_call_details, request)` etc., where
`call = await continuation(details, request)` is awaitable (unary) or async-iterable (streams)."""

from __future__ import annotations

import abc
import asyncio
from typing import (
    Any,
    AsyncIterable,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    List,
    Optional,
    Tuple,
    Union,
)

from google.protobuf.message import Message

from . import _native
from ._client import AsyncResponseStream, CallInfo, _pump_async
from ._errors import Code, StatusError
from ._interceptors import ClientCallDetails, _details, _MdList, _method_of, chain
from ._loop import completer


def _code_of(err: Optional[BaseException]) -> Code:
    if err is None:
        return Code.OK
    if isinstance(err, StatusError):
        return err.code
    return Code.CANCELLED if isinstance(err, asyncio.CancelledError) else Code.UNKNOWN


class UnaryCall:
    """A unary or client-streaming call under way: `await call` is the response (or raises its
    `StatusError`); `await call.code()`, `details()`, `initial_metadata()`,
    `trailing_metadata()` wait for its end; `add_done_callback(fn)` runs `fn(call)` then."""

    def __init__(self, fut: "asyncio.Future[Any]", abort: Callable[[], None], decode: Any) -> None:
        self._fut = fut
        self._abort = abort
        self._decode = decode
        self._response: Any = None

    def __await__(self) -> Generator[Any, None, Any]:
        return self._result().__await__()

    async def _result(self) -> Any:
        try:
            raw = await self._fut
        except asyncio.CancelledError:
            self._abort()
            raise
        if self._response is None:
            self._response = self._decode(raw[0])
        return self._response

    async def _end(self) -> Tuple[Optional[BaseException], Any]:
        if not self._fut.done():  # wait without cancelling the call when the waiter is
            await asyncio.wait([self._fut])
        if self._fut.cancelled():
            return asyncio.CancelledError(), None
        return self._fut.exception(), self._fut.result() if self._fut.exception() is None else None

    async def code(self) -> Code:
        return _code_of((await self._end())[0])

    async def details(self) -> str:
        err = (await self._end())[0]
        return err.message if isinstance(err, StatusError) else "" if err is None else str(err)

    async def initial_metadata(self) -> _MdList:
        raw = (await self._end())[1]
        return list(raw[1] or []) if raw else []

    async def trailing_metadata(self) -> _MdList:
        err, raw = await self._end()
        if isinstance(err, StatusError):
            return err.trailers
        return list(raw[2] or []) if raw else []

    def done(self) -> bool:
        return self._fut.done()

    def cancelled(self) -> bool:
        return self._fut.cancelled()

    def cancel(self) -> bool:
        if self._fut.done():
            return False
        self._fut.cancel()
        self._abort()
        return True

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        self._fut.add_done_callback(lambda _: fn(self))


class StreamCall(AsyncResponseStream[Any]):
    """A server-streaming or bidirectional call: `async for`; `await call.code()` and
    `details()` wait for the end of the stream (someone must iterate it);
    `add_done_callback(fn)` runs `fn(call)` then."""

    def __init__(self, stream: _native.MessageStream, decode: Any, pump: Any = None) -> None:
        super().__init__(stream, decode, pump)
        self._done: "asyncio.Future[Optional[BaseException]]" = (
            asyncio.get_running_loop().create_future()
        )

    def _set(self, err: Optional[BaseException]) -> None:
        if not self._done.done():
            self._done.set_result(err)

    async def __anext__(self) -> Any:
        try:
            return await super().__anext__()
        except StopAsyncIteration:
            self._set(None)
            raise
        except BaseException as e:
            self._set(e)
            raise

    def cancel(self) -> None:
        super().cancel()
        self._set(asyncio.CancelledError())

    def done(self) -> bool:
        return self._done.done()

    async def code(self) -> Code:
        return _code_of(await asyncio.shield(self._done))

    async def details(self) -> str:
        err = await asyncio.shield(self._done)
        return err.message if isinstance(err, StatusError) else "" if err is None else str(err)

    async def initial_metadata(self) -> _MdList:
        return self.headers() or []

    async def trailing_metadata(self) -> _MdList:
        err = await asyncio.shield(self._done)
        return err.trailers if isinstance(err, StatusError) else self.trailers() or []

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        self._done.add_done_callback(lambda _: fn(self))


class _Started(AsyncResponseStream[Any]):
    """A streaming call whose interceptors run in a task started at the call: iterating waits
    for what they return (the `StreamCall`, or an async iterator of their own)."""

    def __init__(self, start: Coroutine[Any, Any, Any], made: List[StreamCall]) -> None:
        self._task = asyncio.get_running_loop().create_task(start)
        self._made = made
        self._it: Any = None

    async def __anext__(self) -> Any:
        if self._it is None:
            self._it = (await _through(self._task, self._made)).__aiter__()
        return await self._it.__anext__()

    def cancel(self) -> None:
        self._task.cancel()
        if self._made:
            self._made[-1].cancel()

    def headers(self) -> Optional[_MdList]:
        return self._made[-1].headers() if self._made else None

    def trailers(self) -> Optional[_MdList]:
        return self._made[-1].trailers() if self._made else None

    def __del__(self) -> None:
        pass


UnaryContinuation = Callable[[ClientCallDetails, Any], Awaitable[UnaryCall]]
StreamContinuation = Callable[[ClientCallDetails, Any], Awaitable[StreamCall]]


class UnaryUnaryClientInterceptor(abc.ABC):
    @abc.abstractmethod
    async def intercept_unary_unary(
        self, continuation: UnaryContinuation, client_call_details: ClientCallDetails, request: Any
    ) -> Union[UnaryCall, Message]:
        """Awaits `continuation(details, request)` (or not); returns the call or a response."""


class UnaryStreamClientInterceptor(abc.ABC):
    @abc.abstractmethod
    async def intercept_unary_stream(
        self, continuation: StreamContinuation, client_call_details: ClientCallDetails, request: Any
    ) -> Union[StreamCall, AsyncIterable[Any]]:
        """Returns the `StreamCall` of `continuation(details, request)` or an async iterator."""


class StreamUnaryClientInterceptor(abc.ABC):
    @abc.abstractmethod
    async def intercept_stream_unary(
        self,
        continuation: UnaryContinuation,
        client_call_details: ClientCallDetails,
        request_iterator: Any,
    ) -> Union[UnaryCall, Message]:
        """Awaits `continuation(details, request_iterator)`; returns the call or a response."""


class StreamStreamClientInterceptor(abc.ABC):
    @abc.abstractmethod
    async def intercept_stream_stream(
        self,
        continuation: StreamContinuation,
        client_call_details: ClientCallDetails,
        request_iterator: Any,
    ) -> Union[StreamCall, AsyncIterable[Any]]:
        """Returns the `StreamCall` of `continuation(details, requests)` or an async iterator."""


AIO_KINDS = (
    UnaryUnaryClientInterceptor,
    UnaryStreamClientInterceptor,
    StreamUnaryClientInterceptor,
    StreamStreamClientInterceptor,
)


async def _through(start: Awaitable[Any], made: List[Any]) -> Any:
    """What the interceptors return; a cancelled caller cancels the call they started."""
    try:
        return await start
    except asyncio.CancelledError:
        for c in made:
            c.cancel()
        raise


async def _finish_unary(start: Awaitable[Any], made: List[UnaryCall]) -> Tuple[Any, CallInfo]:
    out = await _through(start, made)
    if isinstance(out, UnaryCall):
        resp = await out
        return resp, CallInfo(await out.initial_metadata(), await out.trailing_metadata())
    real = made[-1] if made and made[-1].done() else None  # a response of the interceptor's
    if real is None:
        return out, CallInfo([], [])
    return out, CallInfo(await real.initial_metadata(), await real.trailing_metadata())


async def unary_unary(m: Any, request: Any, timeout: Any, metadata: Any) -> Tuple[Any, CallInfo]:
    made: List[UnaryCall] = []

    async def real(d: Any, req: Any) -> UnaryCall:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        h = m._channel.native.unary_async(
            completer(loop),
            fut,
            _method_of(d),
            req.SerializeToString(),
            d.timeout,
            d.metadata,
            True,
        )
        made.append(UnaryCall(fut, h.abort, m._decode))
        return made[-1]

    name = "intercept_unary_unary"
    fn = chain(m._channel._interceptors, UnaryUnaryClientInterceptor, name, real)
    return await _finish_unary(fn(_details(m._method, timeout, metadata), request), made)


async def stream_unary(m: Any, requests: Any, timeout: Any, metadata: Any) -> Tuple[Any, CallInfo]:
    made: List[UnaryCall] = []

    async def real(d: Any, reqs: Any) -> UnaryCall:
        sender, pending = m._channel.native.client_streaming(_method_of(d), d.timeout, d.metadata)
        loop = asyncio.get_running_loop()
        pump = loop.create_task(_pump_async(sender, reqs))
        fut = loop.create_future()
        pending.wait_async(completer(loop), fut, True)
        fut.add_done_callback(lambda _: pump.cancel() if not pump.done() else None)

        def cancel() -> None:
            pending.cancel()
            pump.cancel()

        made.append(UnaryCall(fut, cancel, m._decode))
        return made[-1]

    name = "intercept_stream_unary"
    fn = chain(m._channel._interceptors, StreamUnaryClientInterceptor, name, real)
    return await _finish_unary(fn(_details(m._method, timeout, metadata), requests), made)


def unary_stream(m: Any, request: Any, timeout: Any, metadata: Any) -> AsyncResponseStream[Any]:
    made: List[StreamCall] = []

    async def real(d: Any, req: Any) -> StreamCall:
        s = m._channel.native.server_streaming(
            _method_of(d), req.SerializeToString(), d.timeout, d.metadata
        )
        made.append(StreamCall(s, m._decode))
        return made[-1]

    name = "intercept_unary_stream"
    fn = chain(m._channel._interceptors, UnaryStreamClientInterceptor, name, real)
    return _Started(fn(_details(m._method, timeout, metadata), request), made)


def stream_stream(m: Any, requests: Any, timeout: Any, metadata: Any) -> AsyncResponseStream[Any]:
    made: List[StreamCall] = []

    async def real(d: Any, reqs: Any) -> StreamCall:
        sender, s = m._channel.native.streaming(_method_of(d), d.timeout, d.metadata)
        pump = asyncio.get_running_loop().create_task(_pump_async(sender, reqs))
        made.append(StreamCall(s, m._decode, pump))
        return made[-1]

    name = "intercept_stream_stream"
    fn = chain(m._channel._interceptors, StreamStreamClientInterceptor, name, real)
    return _Started(fn(_details(m._method, timeout, metadata), requests), made)


def stream_error(call: StreamCall) -> Optional[BaseException]:
    """How a finished streaming call ended: None (OK) or its error (for done callbacks)."""
    return call._done.result() if call._done.done() else None
