"""Clients: `Channel` (blocking) and `AsyncChannel` (asyncio), and the typed method objects
generated clients are made of."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import (
    Any,
    AsyncIterable,
    AsyncIterator,
    Generic,
    Iterable,
    Iterator,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
)

from google.protobuf.message import Message

from . import _native
from ._errors import Metadata, MetadataValue
from ._loop import completer

Req = TypeVar("Req", bound=Message, contravariant=True)
Resp = TypeVar("Resp", bound=Message)


PathLike = Union[str, "os.PathLike[str]"]


def _path(p: Optional[PathLike]) -> Optional[str]:
    return None if p is None else os.fspath(p)


class CallInfo:
    """What came with a reply besides the message: headers and trailers."""

    def __init__(
        self, headers: list[tuple[str, MetadataValue]], trailers: list[tuple[str, MetadataValue]]
    ) -> None:
        self.headers = headers
        self.trailers = trailers

    def __repr__(self) -> str:
        return f"CallInfo(headers={self.headers!r}, trailers={self.trailers!r})"


class Channel:
    """A blocking client channel to `tcp://host:port`, `unix:///path`, `unix:@name`,
    `tls://host:port`, `ws://host:port/path` or `wss://host:port/path`.

    One connection, shared by every call and thread; it connects on the first call. Calls
    release the GIL while they wait and can be interrupted with Ctrl-C (the call is cancelled).

    TLS (`tls://`, `wss://`): `ca_pem` is a PEM file of the CAs to trust (default: the webpki
    roots), `cert_pem` and `key_pem` a client certificate chain and key for mutual TLS,
    `server_name` the name to check the server's certificate against (default: the address's
    host). `max_message_size` bounds responses (default 64 MiB); `timeout` (seconds) applies
    to calls that set none; `compression` ("zstd" or "gzip") compresses requests and accepts
    compressed responses. `interceptors` (`topspin.UnaryUnaryClientInterceptor` and its
    siblings; `topspin.aio.*` ones for `AsyncChannel`) see every call, the first outermost.
    """

    _interceptors: Tuple[Any, ...] = ()

    def __init__(
        self,
        address: str,
        *,
        ca_pem: Optional[PathLike] = None,
        cert_pem: Optional[PathLike] = None,
        key_pem: Optional[PathLike] = None,
        server_name: Optional[str] = None,
        max_message_size: Optional[int] = None,
        timeout: Optional[float] = None,
        compression: Optional[str] = None,
        interceptors: Optional[Sequence[Any]] = None,
    ) -> None:
        self.address = address
        if interceptors:
            from ._interceptors import check_interceptors

            self._interceptors = check_interceptors(self, interceptors)
        self._ch: Optional[_native.Channel] = _native.Channel(
            address,
            ca_pem=_path(ca_pem),
            cert_pem=_path(cert_pem),
            key_pem=_path(key_pem),
            server_name=server_name,
            max_message_size=max_message_size,
            timeout=timeout,
            compression=compression,
        )

    @property
    def native(self) -> _native.Channel:
        if self._ch is None:
            raise ValueError("the channel is closed")
        return self._ch

    def close(self) -> None:
        """Drops the connection once no call uses it."""
        self._ch = None

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def unary_unary(self, method: str, response_type: Type[Resp]) -> "UnaryUnary[Any, Resp]":
        return UnaryUnary(self, method, response_type)


class AsyncChannel(Channel):
    """An asyncio client channel. Cancelling the task of a call cancels the call on the wire."""

    async def __aenter__(self) -> "AsyncChannel":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


def _full(r: Tuple[bytes, Any, Any]) -> Tuple[bytes, CallInfo]:
    return r[0], CallInfo(r[1], r[2])


class _Method(Generic[Req, Resp]):
    def __init__(self, channel: Channel, method: str, response_type: Type[Resp]) -> None:
        self._channel = channel
        self._method = method
        self._decode: Any = response_type.FromString
        self._cached: Optional[Tuple[asyncio.AbstractEventLoop, _native.Completer]] = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._method}>"


class UnaryUnary(_Method[Req, Resp]):
    """A unary method of a blocking client."""

    def __call__(
        self, request: Req, *, timeout: Optional[float] = None, metadata: Optional[Metadata] = None
    ) -> Resp:
        if self._channel._interceptors:
            return self.with_call(request, timeout=timeout, metadata=metadata)[0]
        data = self._channel.native.unary(
            self._method, request.SerializeToString(), timeout, metadata
        )
        r: Resp = self._decode(data)
        return r

    def with_call(
        self, request: Req, *, timeout: Optional[float] = None, metadata: Optional[Metadata] = None
    ) -> Tuple[Resp, CallInfo]:
        """The reply and its headers and trailers."""
        if self._channel._interceptors:
            from . import _interceptors

            return _interceptors.unary_unary(self, request, timeout, metadata)
        raw = self._channel.native.unary(
            self._method, request.SerializeToString(), timeout, metadata, True
        )
        data, info = _full(raw)
        r: Resp = self._decode(data)
        return r, info


class ResponseStream(Generic[Resp]):
    """The responses of a streaming call: iterate; `cancel()` ends the call early."""

    def __init__(self, stream: _native.MessageStream, decode: Any) -> None:
        self._stream = stream
        self._decode = decode

    def __iter__(self) -> "ResponseStream[Resp]":
        return self

    def __next__(self) -> Resp:
        b = self._stream.next()
        if b is None:
            raise StopIteration
        r: Resp = self._decode(b)
        return r

    def cancel(self) -> None:
        self._stream.cancel()

    def headers(self) -> Optional[list[tuple[str, MetadataValue]]]:
        return self._stream.headers()

    def trailers(self) -> Optional[list[tuple[str, MetadataValue]]]:
        return self._stream.trailers()

    def __del__(self) -> None:
        try:
            self._stream.cancel()
        except Exception:
            pass


class UnaryStream(_Method[Req, Resp]):
    """A server-streaming method of a blocking client."""

    def __call__(
        self, request: Req, *, timeout: Optional[float] = None, metadata: Optional[Metadata] = None
    ) -> ResponseStream[Resp]:
        if self._channel._interceptors:
            from . import _interceptors

            return _interceptors.unary_stream(self, request, timeout, metadata)
        s = self._channel.native.server_streaming(
            self._method, request.SerializeToString(), timeout, metadata
        )
        return ResponseStream(s, self._decode)


def _pump_sync(sender: _native.Sender, requests: Iterable[Any]) -> None:
    try:
        for r in requests:
            if not sender.send(r.SerializeToString()):
                break
    finally:
        sender.close()


class StreamUnary(_Method[Req, Resp]):
    """A client-streaming method of a blocking client: takes an iterable of requests."""

    def __call__(
        self,
        requests: Iterable[Req],
        *,
        timeout: Optional[float] = None,
        metadata: Optional[Metadata] = None,
    ) -> Resp:
        return self.with_call(requests, timeout=timeout, metadata=metadata)[0]

    def with_call(
        self,
        requests: Iterable[Req],
        *,
        timeout: Optional[float] = None,
        metadata: Optional[Metadata] = None,
    ) -> Tuple[Resp, CallInfo]:
        if self._channel._interceptors:
            from . import _interceptors

            return _interceptors.stream_unary(self, requests, timeout, metadata)
        sender, pending = self._channel.native.client_streaming(self._method, timeout, metadata)
        try:
            _pump_sync(sender, requests)
        except BaseException:
            pending.cancel()
            raise
        data, info = _full(pending.wait(True))
        r: Resp = self._decode(data)
        return r, info


class StreamStream(_Method[Req, Resp]):
    """A bidirectional method of a blocking client: requests are sent from a thread of their
    own while the responses are iterated."""

    def __call__(
        self,
        requests: Iterable[Req],
        *,
        timeout: Optional[float] = None,
        metadata: Optional[Metadata] = None,
    ) -> ResponseStream[Resp]:
        if self._channel._interceptors:
            from . import _interceptors

            return _interceptors.stream_stream(self, requests, timeout, metadata)
        sender, stream = self._channel.native.streaming(self._method, timeout, metadata)
        t = threading.Thread(target=_pump_sync, args=(sender, requests), daemon=True)
        t.start()
        return ResponseStream(stream, self._decode)


# --- asyncio -------------------------------------------------------------------------------


async def _await(fut: "asyncio.Future[Any]", cancel: Any) -> Any:
    try:
        return await fut
    except asyncio.CancelledError:
        cancel()
        raise


def _completer(m: "_Method[Any, Any]", loop: asyncio.AbstractEventLoop) -> _native.Completer:
    # The last loop's completer, cached on the method object.
    c = m._cached
    if c is not None and c[0] is loop:
        return c[1]
    comp = completer(loop)
    m._cached = (loop, comp)
    return comp


class AsyncUnaryUnary(_Method[Req, Resp]):
    """A unary method of an asyncio client."""

    async def __call__(
        self, request: Req, *, timeout: Optional[float] = None, metadata: Optional[Metadata] = None
    ) -> Resp:
        if self._channel._interceptors:
            return (await self.with_call(request, timeout=timeout, metadata=metadata))[0]
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        h = self._channel.native.unary_async(
            _completer(self, loop),
            fut,
            self._method,
            request.SerializeToString(),
            timeout,
            metadata,
        )
        try:
            data = await fut
        except asyncio.CancelledError:
            h.abort()
            raise
        r: Resp = self._decode(data)
        return r

    async def with_call(
        self, request: Req, *, timeout: Optional[float] = None, metadata: Optional[Metadata] = None
    ) -> Tuple[Resp, CallInfo]:
        if self._channel._interceptors:
            from . import _aio_interceptors

            return await _aio_interceptors.unary_unary(self, request, timeout, metadata)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        h = self._channel.native.unary_async(
            completer(loop),
            fut,
            self._method,
            request.SerializeToString(),
            timeout,
            metadata,
            True,
        )
        data, info = _full(await _await(fut, h.abort))
        r: Resp = self._decode(data)
        return r, info


class AsyncResponseStream(Generic[Resp]):
    """The responses of a streaming call: `async for`; `cancel()` ends the call early."""

    def __init__(self, stream: _native.MessageStream, decode: Any, pump: Any = None) -> None:
        self._stream = stream
        self._decode = decode
        self._pump = pump

    def __aiter__(self) -> "AsyncResponseStream[Resp]":
        return self

    async def __anext__(self) -> Resp:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._stream.next_async(completer(loop), fut)
        b = await _await(fut, self.cancel)
        if b is None:
            raise StopAsyncIteration
        r: Resp = self._decode(b)
        return r

    def cancel(self) -> None:
        self._stream.cancel()
        if self._pump is not None:
            self._pump.cancel()

    def headers(self) -> Optional[list[tuple[str, MetadataValue]]]:
        return self._stream.headers()

    def trailers(self) -> Optional[list[tuple[str, MetadataValue]]]:
        return self._stream.trailers()

    def __del__(self) -> None:
        try:
            self._stream.cancel()
        except Exception:
            pass


class AsyncUnaryStream(_Method[Req, Resp]):
    """A server-streaming method of an asyncio client."""

    def __call__(
        self, request: Req, *, timeout: Optional[float] = None, metadata: Optional[Metadata] = None
    ) -> AsyncResponseStream[Resp]:
        if self._channel._interceptors:
            from . import _aio_interceptors

            return _aio_interceptors.unary_stream(self, request, timeout, metadata)
        s = self._channel.native.server_streaming(
            self._method, request.SerializeToString(), timeout, metadata
        )
        return AsyncResponseStream(s, self._decode)


async def send_async(sender: _native.Sender, data: bytes) -> bool:
    """Sends one message from asyncio; False once the call is over."""
    ok = sender.try_send(data)
    if ok is None:
        return False
    if ok:
        return True
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    sender.send_async(completer(loop), fut, data)
    await fut
    return True


async def _pump_async(
    sender: _native.Sender, requests: Union[AsyncIterable[Any], Iterable[Any]]
) -> None:
    try:
        if isinstance(requests, AsyncIterable):
            async for r in requests:
                if not await send_async(sender, r.SerializeToString()):
                    break
        else:
            for r in requests:
                if not await send_async(sender, r.SerializeToString()):
                    break
    finally:
        sender.close()


class AsyncStreamUnary(_Method[Req, Resp]):
    """A client-streaming method of an asyncio client: takes an (async) iterable of requests."""

    async def __call__(
        self,
        requests: Union[AsyncIterable[Req], Iterable[Req]],
        *,
        timeout: Optional[float] = None,
        metadata: Optional[Metadata] = None,
    ) -> Resp:
        return (await self.with_call(requests, timeout=timeout, metadata=metadata))[0]

    async def with_call(
        self,
        requests: Union[AsyncIterable[Req], Iterable[Req]],
        *,
        timeout: Optional[float] = None,
        metadata: Optional[Metadata] = None,
    ) -> Tuple[Resp, CallInfo]:
        if self._channel._interceptors:
            from . import _aio_interceptors

            return await _aio_interceptors.stream_unary(self, requests, timeout, metadata)
        sender, pending = self._channel.native.client_streaming(self._method, timeout, metadata)
        loop = asyncio.get_running_loop()
        pump = loop.create_task(_pump_async(sender, requests))
        fut = loop.create_future()
        pending.wait_async(completer(loop), fut, True)

        def cancel() -> None:
            pending.cancel()
            pump.cancel()

        try:
            raw = await _await(fut, cancel)
        finally:
            if not pump.done():
                pump.cancel()
        data, info = _full(raw)
        r: Resp = self._decode(data)
        return r, info


class AsyncStreamStream(_Method[Req, Resp]):
    """A bidirectional method of an asyncio client: requests are sent by a task of their own."""

    def __call__(
        self,
        requests: Union[AsyncIterable[Req], Iterable[Req]],
        *,
        timeout: Optional[float] = None,
        metadata: Optional[Metadata] = None,
    ) -> AsyncResponseStream[Resp]:
        if self._channel._interceptors:
            from . import _aio_interceptors

            return _aio_interceptors.stream_stream(self, requests, timeout, metadata)
        sender, stream = self._channel.native.streaming(self._method, timeout, metadata)
        pump = asyncio.get_running_loop().create_task(_pump_async(sender, requests))
        return AsyncResponseStream(stream, self._decode, pump)


__all__ = [
    "AsyncChannel",
    "AsyncIterator",
    "AsyncResponseStream",
    "AsyncStreamStream",
    "AsyncStreamUnary",
    "AsyncUnaryStream",
    "AsyncUnaryUnary",
    "CallInfo",
    "Channel",
    "Iterator",
    "ResponseStream",
    "StreamStream",
    "StreamUnary",
    "UnaryStream",
    "UnaryUnary",
]
