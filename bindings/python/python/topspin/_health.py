"""Health checking (`grpc.health.v1`) for Python servers: `Server.add_health()`.

The service is the Rust runtime's (`topspin-health`), so its calls are answered without the
GIL; this is its status table, with the semantics of grpc-go and grpcio's `HealthServicer`.
"""

from __future__ import annotations

import enum
from typing import Optional

from . import _native

SERVICE_NAME = "grpc.health.v1.Health"


class ServingStatus(enum.IntEnum):
    """`grpc.health.v1.HealthCheckResponse.ServingStatus` (the same numbers as grpcio's
    `health_pb2.HealthCheckResponse.SERVING` and the rest)."""

    UNKNOWN = 0
    SERVING = 1
    NOT_SERVING = 2
    SERVICE_UNKNOWN = 3  # (only in `Watch`: no status was ever set for the service)


class Health:
    """The statuses a server's `grpc.health.v1.Health` service reports, by service full name
    (`"kv.v1.Store"`); `""` stands for the whole server, which starts `SERVING`.

    - `Check` answers a service's status, or fails `NOT_FOUND` if none was ever set.
    - `Watch` sends the current status (`SERVICE_UNKNOWN` for an unknown service; the stream
      stays open), then every change; a slow watcher skips to the latest.
    - The server's graceful shutdown (`stop`) turns every service `NOT_SERVING`, then ends the
      open watches.

    Get it from `Server.add_health()`. Thread-safe: set statuses from any thread or task.
    """

    __slots__ = ("_native",)

    def __init__(self) -> None:
        self._native = _native.Health()

    def set(self, service: str, status: int) -> None:
        """Sets `service`'s status (a `ServingStatus`, or grpcio's numbers), as grpcio's
        `HealthServicer.set`. `SERVICE_UNKNOWN` is `clear(service)`. Ignored after
        `shutdown()` until `resume()`."""
        self._native.set(service, int(status))

    def set_serving(self, service: str = "") -> None:
        """`service` is `SERVING`."""
        self.set(service, ServingStatus.SERVING)

    def set_not_serving(self, service: str = "") -> None:
        """`service` is `NOT_SERVING` (e.g. its database went away)."""
        self.set(service, ServingStatus.NOT_SERVING)

    def clear(self, service: str) -> None:
        """Forgets `service`: `Check` fails `NOT_FOUND` again, watchers see `SERVICE_UNKNOWN`."""
        self._native.clear(service)

    def status(self, service: str = "") -> Optional[ServingStatus]:
        """The status `service` reports; None if it is unknown."""
        s = self._native.status(service)
        return None if s is None else ServingStatus(s)

    def shutdown(self) -> None:
        """Every known service `NOT_SERVING`, and later changes ignored until `resume()`
        (grpcio's `enter_graceful_shutdown`). The server's `stop` does it by itself."""
        self._native.shutdown()

    def resume(self) -> None:
        """Undoes `shutdown()`: every known service is `SERVING` again."""
        self._native.resume()

    def __repr__(self) -> str:
        return f"<topspin.Health whole server: {self.status('')!r}>"
