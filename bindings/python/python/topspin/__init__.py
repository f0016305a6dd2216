"""topspin for Python: typed clients and servers from `.proto` files, asyncio and blocking.

Generate code with `python -m topspin.gen -I proto proto/x.proto -o out/`.
"""

from . import aio
from ._client import (
    AsyncChannel,
    AsyncResponseStream,
    AsyncStreamStream,
    AsyncStreamUnary,
    AsyncUnaryStream,
    AsyncUnaryUnary,
    CallInfo,
    Channel,
    ResponseStream,
    StreamStream,
    StreamUnary,
    UnaryStream,
    UnaryUnary,
)
from ._errors import Code, Metadata, StatusError
from ._health import Health, ServingStatus
from ._interceptors import (
    ClientCallDetails,
    StreamCall,
    StreamStreamClientInterceptor,
    StreamUnaryClientInterceptor,
    UnaryOutcome,
    UnaryStreamClientInterceptor,
    UnaryUnaryClientInterceptor,
    intercept_channel,
)
from ._server import MethodHandler, Server, ServerTls, ServicerContext
from ._server_interceptors import (
    HandlerCallDetails,
    RpcMethodHandler,
    ServerInterceptor,
    stream_stream_rpc_method_handler,
    stream_unary_rpc_method_handler,
    unary_stream_rpc_method_handler,
    unary_unary_rpc_method_handler,
)

__all__ = [
    "AsyncChannel",
    "AsyncResponseStream",
    "AsyncStreamStream",
    "AsyncStreamUnary",
    "AsyncUnaryStream",
    "AsyncUnaryUnary",
    "CallInfo",
    "Channel",
    "ClientCallDetails",
    "Code",
    "HandlerCallDetails",
    "Health",
    "Metadata",
    "MethodHandler",
    "ResponseStream",
    "RpcMethodHandler",
    "Server",
    "ServerInterceptor",
    "ServerTls",
    "ServingStatus",
    "ServicerContext",
    "StatusError",
    "StreamCall",
    "StreamStream",
    "StreamStreamClientInterceptor",
    "StreamUnary",
    "StreamUnaryClientInterceptor",
    "UnaryOutcome",
    "UnaryStream",
    "UnaryStreamClientInterceptor",
    "UnaryUnary",
    "UnaryUnaryClientInterceptor",
    "aio",
    "intercept_channel",
    "stream_stream_rpc_method_handler",
    "stream_unary_rpc_method_handler",
    "unary_stream_rpc_method_handler",
    "unary_unary_rpc_method_handler",
]
