"""The asyncio side's interceptors, named as in `grpc.aio`:
`topspin.aio.UnaryUnaryClientInterceptor` (etc.) for `AsyncChannel(address, interceptors=...)`
and `topspin.aio.ServerInterceptor` for `Server(interceptors=...)`."""

from ._aio_interceptors import (
    StreamCall,
    StreamStreamClientInterceptor,
    StreamUnaryClientInterceptor,
    UnaryCall,
    UnaryStreamClientInterceptor,
    UnaryUnaryClientInterceptor,
)
from ._client import AsyncChannel
from ._interceptors import ClientCallDetails
from ._server_interceptors import AsyncServerInterceptor as ServerInterceptor
from ._server_interceptors import HandlerCallDetails, RpcMethodHandler

Channel = AsyncChannel

__all__ = [
    "Channel",
    "ClientCallDetails",
    "HandlerCallDetails",
    "RpcMethodHandler",
    "ServerInterceptor",
    "StreamCall",
    "StreamStreamClientInterceptor",
    "StreamUnaryClientInterceptor",
    "UnaryCall",
    "UnaryStreamClientInterceptor",
    "UnaryUnaryClientInterceptor",
]
