"""topspin for Python: typed clients and servers from `.proto` files, asyncio and blocking.

Generate code with `python -m topspin.gen -I proto proto/x.proto -o out/`.
"""

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
from ._server import MethodHandler, Server, ServerTls, ServicerContext

__all__ = [
    "AsyncChannel",
    "AsyncResponseStream",
    "AsyncStreamStream",
    "AsyncStreamUnary",
    "AsyncUnaryStream",
    "AsyncUnaryUnary",
    "CallInfo",
    "Channel",
    "Code",
    "Metadata",
    "MethodHandler",
    "ResponseStream",
    "Server",
    "ServerTls",
    "ServicerContext",
    "StatusError",
    "StreamStream",
    "StreamUnary",
    "UnaryStream",
    "UnaryUnary",
]
