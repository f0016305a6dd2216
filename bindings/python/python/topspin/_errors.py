"""Status codes and the error every failed call raises."""

from __future__ import annotations

import enum
from typing import Optional, Sequence, Tuple, Union

MetadataValue = Union[str, bytes]
Metadata = Sequence[Tuple[str, MetadataValue]]


class Code(enum.IntEnum):
    """gRPC's 17 status codes, with their numbers on the wire."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class StatusError(Exception):
    """A call that ended with a status other than OK.

    Raised by clients; raise it in a handler to end the call with that status.
    """

    def __init__(
        self,
        code: Code,
        message: str = "",
        details: bytes = b"",
        trailers: Optional[Metadata] = None,
        headers: Optional[Metadata] = None,
    ) -> None:
        super().__init__(f"{Code(code).name}: {message}")
        self.code = Code(code)
        self.message = message
        self.details = details
        self.trailers: list[tuple[str, MetadataValue]] = list(trailers or [])
        #: The response headers that came before the error (a client's), or that go before it
        #: (a handler's, after those of ``set_initial_metadata``), as gRPC servers allow.
        self.headers: list[tuple[str, MetadataValue]] = list(headers or [])

    def __repr__(self) -> str:
        return f"StatusError({self.code.name}, {self.message!r})"


def _make(
    code: int, message: str, details: bytes, trailers: Metadata, headers: Metadata = ()
) -> StatusError:
    try:
        c = Code(code)
    except ValueError:
        c = Code.UNKNOWN
    return StatusError(c, message, details, trailers, headers)
