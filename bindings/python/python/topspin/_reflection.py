"""Server reflection for Python servers: `Server.add_reflection()`.

The service is the Rust runtime's (`topspin-reflection`: `topspin.reflection.v1` for the
`topspin` command, gRPC's `grpc.reflection.v1` and `v1alpha` for grpcurl and the like). It
is given the `.proto` files of the services to describe, and their imports, from protobuf's
descriptor pool: the `_pb2` modules (topspin-gen's, or protoc's) put them there when imported.
"""

from __future__ import annotations

from typing import Iterable, List, Set

from google.protobuf import descriptor, descriptor_pb2, descriptor_pool

SERVICE_NAMES = (
    "topspin.reflection.v1.Reflection",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
)


def service_of(method: str) -> str:
    """`/pkg.Service/Method` -> `pkg.Service`."""
    return method.lstrip("/").split("/", 1)[0]


def file_descriptor_set(
    services: Iterable[str], pool: descriptor_pool.DescriptorPool, *, strict: bool
) -> bytes:
    """The encoded `FileDescriptorSet` of the files that define `services` (full names), each
    after its imports. A service the pool does not know raises ValueError when `strict`, and is
    left out otherwise."""
    out = descriptor_pb2.FileDescriptorSet()
    seen: Set[str] = set()

    def add(f: descriptor.FileDescriptor) -> None:
        if f.name in seen:
            return
        seen.add(f.name)
        for dep in f.dependencies:
            add(dep)
        out.file.add().MergeFromString(f.serialized_pb)

    missing: List[str] = []
    for name in services:
        try:
            add(pool.FindServiceByName(name).file)
        except KeyError:
            missing.append(name)
    if missing and strict:
        raise ValueError(
            f"protobuf's descriptor pool has no service {', '.join(missing)} (import its "
            "generated _pb2 module first)"
        )
    return out.SerializeToString()
