"""Client interceptors for the blocking `Channel`, shaped as grpcio's: `UnaryUnaryClientInterceptor`
and its three siblings, `ClientCallDetails`, and `intercept_channel(channel, *interceptors)`."""

from __future__ import annotations

import abc
import copy
import threading
from typing import (
    Any,
    Callable,
    Iterable,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
)

from . import _native
from ._client import CallInfo, Channel, ResponseStream, _pump_sync
from ._errors import Code, Metadata, MetadataValue, StatusError

_MdList = List[Tuple[str, MetadataValue]]
C = TypeVar("C", bound=Channel)


class ClientCallDetails(NamedTuple):
    """What an interceptor may change about a call before passing it on (`._replace(...)`).

    `method` is `"/pkg.Service/Method"` (a str, also on the asyncio channel). `credentials`,
    `wait_for_ready` and `compression` are there for grpcio's shape and not applied.
    """

    method: str
    timeout: Optional[float]
    metadata: Optional[Metadata]
    credentials: Any = None
    wait_for_ready: Optional[bool] = None
    compression: Any = None


def _method_of(d: Any) -> str:
    m = d.method
    return m.decode() if isinstance(m, bytes) else str(m)


class _Status:
    """The end of a call: its code, message and metadata, and callbacks run once it is over."""

    def __init__(self) -> None:
        self._error: Optional[StatusError] = None
        self._done = False
        self._headers: _MdList = []
        self._trailers: _MdList = []
        self._callbacks: List[Callable[[Any], None]] = []
        self._lock = threading.Lock()

    def _finish(self, error: Optional[BaseException], headers: Any, trailers: Any) -> None:
        if isinstance(error, StatusError):
            self._error = error
            trailers = trailers or error.trailers
        elif error is not None:
            self._error = StatusError(Code.CANCELLED, f"{type(error).__name__}: {error}")
        with self._lock:
            if self._done:
                return
            self._headers = list(headers or [])
            self._trailers = list(trailers or [])
            self._done = True
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        """Runs `fn(call)` when the call is over (at once if it is)."""
        with self._lock:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn(self)

    def code(self) -> Optional[Code]:
        """The final status code (None while a stream is still open)."""
        if not self._done:
            return None
        return Code.OK if self._error is None else self._error.code

    def details(self) -> Optional[str]:
        """The final status message."""
        if not self._done:
            return None
        return "" if self._error is None else self._error.message

    def exception(self) -> Optional[StatusError]:
        return self._error

    def initial_metadata(self) -> _MdList:
        return self._headers

    def trailing_metadata(self) -> _MdList:
        return self._trailers


class UnaryOutcome(_Status):
    """What a unary or client-streaming continuation returns (grpcio's Call + Future): the
    call is over; `result()` is the response or raises its `StatusError`."""

    def __init__(self, response: Any, error: Optional[BaseException], info: Any) -> None:
        super().__init__()
        self._response = response
        self._finish(error, info and info[1], info and info[2])

    def result(self, timeout: Optional[float] = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._response

    def running(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return self._error is not None and self._error.code == Code.CANCELLED

    def cancel(self) -> bool:
        return False


class StreamCall(_Status, ResponseStream[Any]):
    """What a server-streaming or bidirectional continuation returns: the iterator of responses
    and grpcio's Call (`code()` and `details()` once iteration ended; `add_done_callback`)."""

    def __init__(self, stream: _native.MessageStream, decode: Any) -> None:
        _Status.__init__(self)
        ResponseStream.__init__(self, stream, decode)

    def __next__(self) -> Any:
        try:
            return ResponseStream.__next__(self)
        except StopIteration:
            self._finish(None, self.headers(), self.trailers())
            raise
        except BaseException as e:
            self._finish(e, self.headers(), self.trailers())
            raise

    def cancel(self) -> None:
        ResponseStream.cancel(self)
        self._finish(StatusError(Code.CANCELLED, "cancelled"), self.headers(), self.trailers())

    def is_active(self) -> bool:
        return not self._done


class _Adapted(ResponseStream[Any]):
    """What an interceptor returned in place of the `StreamCall` (a generator, say), as the
    `ResponseStream` generated clients promise; cancel and metadata go to the real call."""

    def __init__(self, it: Iterable[Any], real: Optional[StreamCall]) -> None:
        self._it = iter(it)
        self._real = real

    def __next__(self) -> Any:
        return next(self._it)

    def cancel(self) -> None:
        if self._real is not None:
            self._real.cancel()

    def headers(self) -> Optional[_MdList]:
        return None if self._real is None else self._real.headers()

    def trailers(self) -> Optional[_MdList]:
        return None if self._real is None else self._real.trailers()

    def __del__(self) -> None:
        pass


class UnaryUnaryClientInterceptor(abc.ABC):
    @abc.abstractmethod
    def intercept_unary_unary(
        self,
        continuation: Callable[[ClientCallDetails, Any], UnaryOutcome],
        client_call_details: ClientCallDetails,
        request: Any,
    ) -> UnaryOutcome:
        """Calls `continuation(details, request)` (or not) and returns its outcome."""


class UnaryStreamClientInterceptor(abc.ABC):
    @abc.abstractmethod
    def intercept_unary_stream(
        self,
        continuation: Callable[[ClientCallDetails, Any], StreamCall],
        client_call_details: ClientCallDetails,
        request: Any,
    ) -> Iterator[Any]:
        """Returns the `StreamCall` of `continuation(details, request)` or an iterator."""


class StreamUnaryClientInterceptor(abc.ABC):
    @abc.abstractmethod
    def intercept_stream_unary(
        self,
        continuation: Callable[[ClientCallDetails, Iterator[Any]], UnaryOutcome],
        client_call_details: ClientCallDetails,
        request_iterator: Iterator[Any],
    ) -> UnaryOutcome:
        """Calls `continuation(details, request_iterator)` and returns its outcome."""


class StreamStreamClientInterceptor(abc.ABC):
    @abc.abstractmethod
    def intercept_stream_stream(
        self,
        continuation: Callable[[ClientCallDetails, Iterator[Any]], StreamCall],
        client_call_details: ClientCallDetails,
        request_iterator: Iterator[Any],
    ) -> Iterator[Any]:
        """Returns the `StreamCall` of `continuation(details, requests)` or an iterator."""


_SYNC_KINDS = (
    UnaryUnaryClientInterceptor,
    UnaryStreamClientInterceptor,
    StreamUnaryClientInterceptor,
    StreamStreamClientInterceptor,
)


def check_interceptors(channel: Channel, interceptors: Sequence[Any]) -> Tuple[Any, ...]:
    """The interceptors, checked against the kind of channel (blocking or asyncio)."""
    from ._client import AsyncChannel

    kinds: Tuple[type, ...] = _SYNC_KINDS
    if isinstance(channel, AsyncChannel):
        from ._aio_interceptors import AIO_KINDS

        kinds = AIO_KINDS
    for i in interceptors:
        if not isinstance(i, kinds):
            side = "topspin.aio" if isinstance(channel, AsyncChannel) else "topspin"
            raise TypeError(f"{i!r} is not a client interceptor of {side}")
    return tuple(interceptors)


def intercept_channel(channel: C, *interceptors: Any) -> C:
    """A channel sharing `channel`'s connection whose calls (generated clients' too) go through
    `interceptors`, the first outermost (grpc.intercept_channel)."""
    new = copy.copy(channel)
    new._interceptors = check_interceptors(channel, interceptors) + channel._interceptors
    return new


def chain(interceptors: Sequence[Any], kind: type, name: str, last: Callable[..., Any]) -> Any:
    """`last` wrapped by the interceptors of `kind`, the first outermost."""
    fn = last
    for i in reversed([i for i in interceptors if isinstance(i, kind)]):
        fn = _bind(getattr(i, name), fn)
    return fn


def _bind(intercept: Callable[..., Any], nxt: Callable[..., Any]) -> Callable[..., Any]:
    return lambda details, request: intercept(nxt, details, request)


def _details(method: str, timeout: Optional[float], metadata: Optional[Metadata]) -> Any:
    return ClientCallDetails(method, timeout, None if metadata is None else list(metadata))


def _outcome(call: Callable[[], Tuple[Any, Any, Any]], decode: Any) -> UnaryOutcome:
    try:
        raw = call()
    except StatusError as e:
        return UnaryOutcome(None, e, None)
    return UnaryOutcome(decode(raw[0]), None, raw)


def unary_unary(m: Any, request: Any, timeout: Any, metadata: Any) -> Tuple[Any, CallInfo]:
    def real(d: Any, req: Any) -> UnaryOutcome:
        return _outcome(
            lambda: m._channel.native.unary(
                _method_of(d), req.SerializeToString(), d.timeout, d.metadata, True
            ),
            m._decode,
        )

    fn = chain(m._channel._interceptors, UnaryUnaryClientInterceptor, "intercept_unary_unary", real)
    out = fn(_details(m._method, timeout, metadata), request)
    return out.result(), CallInfo(out.initial_metadata(), out.trailing_metadata())


def stream_unary(m: Any, requests: Any, timeout: Any, metadata: Any) -> Tuple[Any, CallInfo]:
    def real(d: Any, reqs: Iterable[Any]) -> UnaryOutcome:
        def call() -> Tuple[Any, Any, Any]:
            sender, pending = m._channel.native.client_streaming(
                _method_of(d), d.timeout, d.metadata
            )
            try:
                _pump_sync(sender, reqs)
            except BaseException:
                pending.cancel()
                raise
            r: Tuple[Any, Any, Any] = pending.wait(True)
            return r

        return _outcome(call, m._decode)

    name = "intercept_stream_unary"
    fn = chain(m._channel._interceptors, StreamUnaryClientInterceptor, name, real)
    out = fn(_details(m._method, timeout, metadata), iter(requests))
    return out.result(), CallInfo(out.initial_metadata(), out.trailing_metadata())


def _stream_result(out: Any, made: List[StreamCall]) -> ResponseStream[Any]:
    if isinstance(out, ResponseStream):
        return out
    return _Adapted(out, made[-1] if made else None)


def unary_stream(m: Any, request: Any, timeout: Any, metadata: Any) -> ResponseStream[Any]:
    made: List[StreamCall] = []

    def real(d: Any, req: Any) -> StreamCall:
        s = m._channel.native.server_streaming(
            _method_of(d), req.SerializeToString(), d.timeout, d.metadata
        )
        made.append(StreamCall(s, m._decode))
        return made[-1]

    name = "intercept_unary_stream"
    fn = chain(m._channel._interceptors, UnaryStreamClientInterceptor, name, real)
    return _stream_result(fn(_details(m._method, timeout, metadata), request), made)


def stream_stream(m: Any, requests: Any, timeout: Any, metadata: Any) -> ResponseStream[Any]:
    made: List[StreamCall] = []

    def real(d: Any, reqs: Iterable[Any]) -> StreamCall:
        sender, s = m._channel.native.streaming(_method_of(d), d.timeout, d.metadata)
        t = threading.Thread(target=_pump_sync, args=(sender, reqs), daemon=True)
        t.start()
        made.append(StreamCall(s, m._decode))
        return made[-1]

    name = "intercept_stream_stream"
    fn = chain(m._channel._interceptors, StreamStreamClientInterceptor, name, real)
    return _stream_result(fn(_details(m._method, timeout, metadata), iter(requests)), made)
