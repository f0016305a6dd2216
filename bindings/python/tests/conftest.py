"""Fixtures: generated kv code, the Rust kvstore server and the Rust clients."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import Iterator, Optional, Tuple

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(PKG))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
KV_PROTO_DIR = os.path.join(ROOT, "examples", "kvstore", "proto")
GEN = os.path.join(PKG, "tests", "gen_out")


def _gen() -> None:
    from topspin.gen import generate

    generate(["kv/v1/kv.proto"], [KV_PROTO_DIR], GEN)


_gen()
sys.path.insert(0, GEN)
sys.path.insert(0, os.path.join(PKG, "examples"))


# Prebuilt peers given by the test command (scripts/test.sh exports these).
PEER_ENV = {
    "kvstore-server": "KVSTORE_SERVER",
    "kvstore-client": "KVSTORE_CLIENT",
    "topspin": "TOPSPIN_CLI",
}


def binary(name: str) -> str:
    path = os.environ.get(PEER_ENV.get(name, ""), "") or os.path.join(TARGET, "debug", name)
    if not os.path.exists(path):
        pytest.skip(f"{path} is not built (scripts/test-python.sh builds it)")
    return path


def grpcurl() -> str:
    """grpcurl, found as go/tools/interop's tests find it: $GRPCURL, on PATH, or
    target/grpc-tools/grpcurl (scripts/setup-grpcurl.sh installs it there). Missing, the test
    is skipped, or fails with TOPSPIN_INTEROP=1 (scripts/test-python.sh sets it)."""
    for p in (
        os.environ.get("GRPCURL", ""),
        shutil.which("grpcurl") or "",
        os.path.join(ROOT, "target", "grpc-tools", "grpcurl"),
    ):
        if p and os.path.exists(p):
            return p
    if os.environ.get("TOPSPIN_INTEROP") == "1":
        pytest.fail("TOPSPIN_INTEROP=1: grpcurl is not installed (scripts/setup-grpcurl.sh)")
    pytest.skip("grpcurl not found (scripts/setup-grpcurl.sh installs it)")


def start_server(
    cmd: list[str], cwd: Optional["os.PathLike[str]"] = None
) -> Tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=cwd)
    assert p.stdout is not None
    line = p.stdout.readline()
    m = re.search(r"listening on (\S+)", line)
    if not m:
        p.kill()
        raise RuntimeError(f"server said {line!r}")
    addr = m.group(1)
    if not re.match(r"^[a-z]+:", addr):
        addr = "tcp://" + addr
    return p, addr


@pytest.fixture(params=["tcp", "unix"])
def kv_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """The Rust kvstore server, over TCP or a Unix socket; yields its address."""
    exe = binary("kvstore-server")
    with tempfile.TemporaryDirectory() as d:
        addr = "tcp://127.0.0.1:0" if request.param == "tcp" else f"unix://{d}/kv.sock"
        p, bound = start_server([exe, addr])
        try:
            yield bound if request.param == "tcp" else addr
        finally:
            p.terminate()
            p.wait(10)


def ws_upgrade_status(address: str, origin: str) -> int:
    """The HTTP status a WebSocket upgrade from a page of `origin` gets at `address`."""
    hostport = address.split("://", 1)[1].split("/", 1)[0]
    host, port = hostport.rsplit(":", 1)
    head = (
        f"GET / HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        f"Sec-WebSocket-Protocol: topspin.v1\r\nOrigin: {origin}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(head.encode())
        return int(s.recv(4096).split(b"\r\n", 1)[0].split()[1])
