"""The Python part of the cross-language matrix (testdata/matrix/README.md): the server
(matrix/server.py) as a process, both client modes (matrix/client.py) as processes against
it over every transport it serves, and its SIGTERM exit."""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
from conftest import ws_upgrade_status

import topspin

HERE = os.path.dirname(os.path.abspath(__file__))
MATRIX = os.path.join(os.path.dirname(HERE), "matrix")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
CHECKS = [
    "unary",
    "large",
    "server-stream",
    "quiet-stream",
    "client-stream",
    "bidi-open-then-send",
    "deadline",
    "cancel",
    "error-details",
    "compression",
    "trace",
]


def start_server(listen: list[str]) -> tuple[subprocess.Popen[str], list[str]]:
    """Starts matrix/server.py; returns it and the addresses it printed, in order."""
    cmd = [sys.executable, os.path.join(MATRIX, "server.py")]
    for a in listen:
        cmd += ["--listen", a]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    bound = []
    for _ in listen:
        line = p.stdout.readline()
        if not line.startswith("listening "):
            p.kill()
            raise RuntimeError(f"the server said {line!r}")
        bound.append(line.split()[1])
    return p, bound


@pytest.fixture(scope="module")
def server() -> Iterator[Dict[str, str]]:
    """One server on tcp, unix and ws; yields {transport: address}."""
    with tempfile.TemporaryDirectory() as d:
        listen = ["tcp://127.0.0.1:0", f"unix://{d}/matrix.sock", "ws://127.0.0.1:0/"]
        p, bound = start_server(listen)
        try:
            yield dict(zip(("tcp", "unix", "ws"), bound))
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(10)


@pytest.mark.parametrize("transport", ["tcp", "unix", "ws"])
@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_client_passes_every_check(server: Dict[str, str], mode: str, transport: str) -> None:
    cmd = [sys.executable, os.path.join(MATRIX, "client.py"), "--mode", mode]
    r = subprocess.run(
        cmd + ["--target", server[transport]], capture_output=True, text=True, timeout=70
    )
    lines = r.stdout.splitlines()
    assert lines == [f"ok {c}" for c in CHECKS], r.stdout + r.stderr
    assert r.returncode == 0


def test_websocket_upgrades_from_any_origin(server: Dict[str, str]) -> None:
    """The contract: the Chromium client's page, of an origin of its own, may connect."""
    assert ws_upgrade_status(server["ws"], "http://page.example") == 101


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_client_reports_failures_and_exits_1(mode: str) -> None:
    """Against an address nobody serves, every check fails on its own line, and soon."""
    with tempfile.TemporaryDirectory() as d:
        t0 = time.monotonic()
        r = subprocess.run(
            [sys.executable, os.path.join(MATRIX, "client.py"), "--mode", mode]
            + ["--target", f"unix://{d}/nobody.sock"],
            capture_output=True,
            text=True,
            timeout=70,
        )
    assert time.monotonic() - t0 < 60
    names = [line.split(":")[0] for line in r.stdout.splitlines()]
    assert names == [f"FAIL {c}" for c in CHECKS], r.stdout + r.stderr
    assert r.returncode == 1


def test_server_exits_0_on_sigterm_with_a_call_held() -> None:
    p, (addr,) = start_server(["tcp://127.0.0.1:0"])
    # A quiet stream held open over the shutdown.
    hold = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time, topspin, common\n"
            "common.load_generated()\n"
            "import matrix_pb2 as pb, matrix_topspin as rpc\n"
            "c = rpc.MatrixClient(topspin.Channel(sys.argv[1]))\n"
            "s = c.ServerStream(pb.StreamReq(hold=True, tag='held'))\n"
            "print('held', flush=True)\n"
            "time.sleep(30)\n",
            addr,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": MATRIX},
    )
    try:
        assert hold.stdout is not None and hold.stdout.readline() == "held\n"
        time.sleep(0.2)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        assert p.wait(5) == 0
        assert time.monotonic() - t0 < 2.0
    finally:
        hold.kill()
        hold.wait()
        p.kill()
        p.wait()


def test_matrix_programs_are_ruff_and_mypy_clean(tmp_path: Path) -> None:
    """scripts/test-python.sh lints python/, tests/, examples/ and bench/; this covers
    matrix/ the same way (mypy against matrix.proto's generated code)."""
    pytest.importorskip("mypy")
    pytest.importorskip("ruff")
    from topspin.gen import generate

    generate(["matrix.proto"], [os.path.join(ROOT, "testdata", "matrix")], str(tmp_path))
    pkg = os.path.dirname(MATRIX)
    env = {**os.environ, "MYPYPATH": f"{tmp_path}{os.pathsep}{MATRIX}"}
    for cmd in (
        ["ruff", "check", "matrix"],
        ["ruff", "format", "--check", "matrix"],
        ["mypy", "matrix"],
    ):
        r = subprocess.run(
            [sys.executable, "-m", *cmd], cwd=pkg, env=env, capture_output=True, text=True
        )
        assert r.returncode == 0, f"{' '.join(cmd)}:\n{r.stdout}{r.stderr}"


def test_compression_check_sends_gzip_then_zstd() -> None:
    """The compression check's requests do go compressed (the server sees their encoding),
    with the blocking and the asyncio client; in process."""
    sys.path.insert(0, MATRIX)
    try:
        common = importlib.import_module("common")
        matrix_server = importlib.import_module("server")
        checks_sync = importlib.import_module("checks_sync")
        checks_asyncio = importlib.import_module("checks_asyncio")
    finally:
        sys.path.remove(MATRIX)
    seen: list[object] = []

    class Recording(matrix_server.Matrix):  # type: ignore[name-defined,misc]
        async def Unary(self, request: Any, context: topspin.ServicerContext) -> Any:
            seen.append(common.first(context.invocation_metadata(), "topspin-encoding"))
            return await super().Unary(request, context)

    server = topspin.Server()
    matrix_server.rpc.add_MatrixServicer_to_server(Recording(), server)
    address = server.start("tcp://127.0.0.1:0")
    try:
        checks_sync.Checks(address, str).compression()
        asyncio.run(checks_asyncio.Checks(address, str).compression())
    finally:
        server.stop(1)
    assert seen == ["gzip", "zstd", "gzip", "zstd"]


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_trace_check_fails_against_a_server_without_instrumentation(mode: str) -> None:
    """The `trace` check passes only when the server continued the client's trace: against
    the matrix servicer on a server without topspin.otel it fails (and every other passes)."""
    sys.path.insert(0, MATRIX)
    try:
        matrix_server = importlib.import_module("server")
    finally:
        sys.path.remove(MATRIX)
    server = topspin.Server()
    matrix_server.rpc.add_MatrixServicer_to_server(matrix_server.Matrix(), server)
    address = server.start("tcp://127.0.0.1:0")
    try:
        r = subprocess.run(
            [sys.executable, os.path.join(MATRIX, "client.py"), "--mode", mode]
            + ["--target", address],
            capture_output=True,
            text=True,
            timeout=70,
        )
    finally:
        server.stop(1)
    lines = r.stdout.splitlines()
    assert lines[:-1] == [f"ok {c}" for c in CHECKS[:-1]], r.stdout + r.stderr
    assert lines[-1].startswith("FAIL trace: x-trace-id None"), r.stdout + r.stderr
    assert r.returncode == 1
