"""Typed generated code: `mypy --strict` (with no settings of this project) on a user's program
that calls the generated clients and implements a generated servicer passes, and on a wrong one
reports exactly its wrong lines; with mypy-protobuf's `_pb2.pyi` and with the built-in ones."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import KV_PROTO_DIR

from topspin.gen import generate, have_mypy_protobuf

GOOD = """
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Iterable, Iterator, Optional

import topspin
from kv.v1 import kv_pb2, kv_topspin


class Store(kv_topspin.StoreServicer):
    def __init__(self) -> None:
        self.entries: dict[str, kv_pb2.Entry] = {}

    def Get(self, request: kv_pb2.GetRequest, context: topspin.ServicerContext) -> kv_pb2.Entry:
        return self.entries[request.key]

    def Put(
        self, request: kv_pb2.PutRequest, context: topspin.ServicerContext
    ) -> kv_pb2.PutResponse:
        e = kv_pb2.Entry(key=request.key, value=request.value, version=1)
        if request.HasField("expected_version"):
            e.version = request.expected_version + 1
        self.entries[request.key] = e
        return kv_pb2.PutResponse(version=e.version)

    def Watch(
        self, request: kv_pb2.WatchRequest, context: topspin.ServicerContext
    ) -> Iterable[kv_pb2.Event]:
        for e in self.entries.values():
            yield kv_pb2.Event(put=e)

    def Apply(
        self, request: Iterator[kv_pb2.Mutation], context: topspin.ServicerContext
    ) -> kv_pb2.ApplySummary:
        s = kv_pb2.ApplySummary()
        for m in request:
            if m.WhichOneof("op") == "put":
                s.puts += 1
        return s

    def GetMany(
        self, request: Iterator[kv_pb2.GetRequest], context: topspin.ServicerContext
    ) -> Iterable[kv_pb2.Entry]:
        for r in request:
            yield self.entries[r.key]


class AsyncStore(kv_topspin.StoreAsyncServicer):
    async def GetMany(
        self, request: AsyncIterator[kv_pb2.GetRequest], context: topspin.ServicerContext
    ) -> AsyncIterator[kv_pb2.Entry]:
        async for r in request:
            yield kv_pb2.Entry(key=r.key)


def use(c: kv_topspin.StoreClient) -> Optional[str]:
    c.Put(kv_pb2.PutRequest(key="a", value="b", expected_version=0), timeout=1.0)
    e: kv_pb2.Entry = c.Get(kv_pb2.GetRequest(key="a"), metadata=[("user", "ann")])
    resp, info = c.Put.with_call(kv_pb2.PutRequest(key="c"))
    version: int = resp.version
    for ev in c.Watch(kv_pb2.WatchRequest(prefix="a", include_existing=True)):
        if ev.HasField("put"):
            return ev.put.value
    summary = c.Apply(iter([kv_pb2.Mutation(put=kv_pb2.PutRequest(key="b"))]))
    return f"{e.value} {version} {summary.puts} {info.headers}"


async def use_async(c: kv_topspin.StoreAsyncClient) -> int:
    r: kv_pb2.PutResponse = await c.Put(kv_pb2.PutRequest(key="a", value="b"))
    n = 0
    async for e in c.GetMany([kv_pb2.GetRequest(key="a")]):
        n += e.version
    return n + r.version


def main() -> None:
    server = topspin.Server()
    kv_topspin.add_StoreServicer_to_server(Store(), server)
    address = server.start("tcp://127.0.0.1:0")
    print(use(kv_topspin.StoreClient(topspin.Channel(address))))
    print(asyncio.run(use_async(kv_topspin.StoreAsyncClient(topspin.AsyncChannel(address)))))
    server.stop(1)
"""

# Each line that mypy must reject ends with `# E` (`# E mypy-protobuf`: only with its stubs).
BAD = """
from __future__ import annotations

import topspin
from kv.v1 import kv_pb2, kv_topspin


class Store(kv_topspin.StoreServicer):
    def Get(self, request: kv_pb2.GetRequest, context: topspin.ServicerContext) -> kv_pb2.Entry:
        return kv_pb2.PutResponse(version=1)  # E


def use(c: kv_topspin.StoreClient) -> None:
    c.Put(kv_pb2.PutRequest(key="a", value=3))  # E
    e = c.Get(kv_pb2.GetRequest(key="a"))
    e.version = "one"  # E
    name: int = e.key  # E
    c.Get(kv_pb2.PutRequest(key="a"))  # E
    ev = next(iter(c.Watch(kv_pb2.WatchRequest())))
    ev.HasField("nope")  # E mypy-protobuf


async def use_async(c: kv_topspin.StoreAsyncClient) -> None:
    r: kv_pb2.Entry = await c.Put(kv_pb2.PutRequest(key="a"))  # E
"""


def mypy_strict(tmp_path: Path, gen: Path) -> dict[str, set[int]]:
    """Runs `mypy --strict` on good.py and bad.py (no config of this project: an empty one);
    returns the lines with errors, by file."""
    (tmp_path / "mypy.ini").write_text("[mypy]\n")
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "bad.py").write_text(BAD)
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", "mypy.ini"]
        + ["--cache-dir", str(tmp_path / ".mypy_cache"), "good.py", "bad.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(gen)},
        check=False,
    )
    errors: dict[str, set[int]] = {"good.py": set(), "bad.py": set()}
    for m in re.finditer(r"^(\w+\.py):(\d+): error:", r.stdout, re.M):
        errors.setdefault(m.group(1), set()).add(int(m.group(2)))
    assert r.returncode == (1 if any(errors.values()) else 0), r.stdout + r.stderr
    assert set(errors) == {"good.py", "bad.py"}, r.stdout
    return errors


@pytest.mark.parametrize("pyi", ["mypy-protobuf", "builtin"])
def test_mypy_strict_on_a_users_program(tmp_path: Path, pyi: str) -> None:
    pytest.importorskip("mypy")
    if pyi == "mypy-protobuf" and not have_mypy_protobuf():
        pytest.skip("mypy-protobuf is not installed")
    gen = tmp_path / "gen"
    generate(["kv/v1/kv.proto"], [KV_PROTO_DIR], str(gen), pyi=pyi)
    stub = (gen / "kv" / "v1" / "kv_pb2.pyi").read_text()
    assert ("@generated by mypy-protobuf" in stub) == (pyi == "mypy-protobuf")
    errors = mypy_strict(tmp_path, gen)
    want = {
        i + 1
        for i, line in enumerate(BAD.splitlines())
        if line.endswith("# E") or (pyi == "mypy-protobuf" and line.endswith("# E mypy-protobuf"))
    }
    assert errors == {"good.py": set(), "bad.py": want}


def test_good_program_runs(tmp_path: Path) -> None:
    """The program mypy accepts also works (so the types it was checked against are true)."""
    gen = tmp_path / "gen"
    generate(["kv/v1/kv.proto"], [KV_PROTO_DIR], str(gen))
    (tmp_path / "good.py").write_text(GOOD + "\n\nmain()\n")
    r = subprocess.run(
        [sys.executable, str(tmp_path / "good.py")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(gen)},
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["b", "2"], r.stdout


def test_pyi_choice_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pyi must be one of"):
        generate(["kv/v1/kv.proto"], [KV_PROTO_DIR], str(tmp_path), pyi="protoc")
    r = subprocess.run(
        [sys.executable, "-m", "topspin.gen", "-I", KV_PROTO_DIR, "kv/v1/kv.proto"]
        + ["-o", str(tmp_path), "--pyi", "builtin"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "mypy-protobuf" not in (tmp_path / "kv" / "v1" / "kv_pb2.pyi").read_text()


def test_mypy_protobuf_stubs_across_files(tmp_path: Path) -> None:
    """Imports between the user's files, well-known types, enums, maps, oneofs, nested
    messages: mypy-protobuf's stubs of protox's descriptors check under `mypy --strict`."""
    pytest.importorskip("mypy")
    if not have_mypy_protobuf():
        pytest.skip("mypy-protobuf is not installed")
    src = tmp_path / "proto"
    (src / "shop" / "v1").mkdir(parents=True)
    (src / "shop" / "v1" / "types.proto").write_text(
        'syntax = "proto3";\npackage shop.v1;\nimport "google/protobuf/timestamp.proto";\n'
        "enum Size { SIZE_UNSPECIFIED = 0; SMALL = 1; LARGE = 2; }\n"
        "message Item { string name = 1; Size size = 2; map<string, int64> stock = 3;\n"
        "  google.protobuf.Timestamp added = 4; optional string note = 5;\n"
        "  message Tag { string label = 1; } repeated Tag tags = 6;\n"
        "  oneof price { int64 cents = 7; string free_because = 8; } }\n"
    )
    (src / "shop" / "v1" / "shop.proto").write_text(
        'syntax = "proto3";\npackage shop.v1;\nimport "shop/v1/types.proto";\n'
        "message Find { string name = 1; }\n"
        "service Shop { rpc Get(Find) returns (Item); rpc List(Find) returns (stream Item); }\n"
    )
    gen = tmp_path / "gen"
    generate(["shop/v1/shop.proto"], [str(src)], str(gen), pyi="mypy-protobuf")
    (tmp_path / "mypy.ini").write_text("[mypy]\n")
    use = (
        "from google.protobuf import timestamp_pb2\n"
        "import topspin\n"
        "from shop.v1 import shop_pb2, shop_topspin, types_pb2\n\n"
        "class Shop(shop_topspin.ShopServicer):\n"
        "    def Get(self, request: shop_pb2.Find, context: topspin.ServicerContext)"
        " -> types_pb2.Item:\n"
        "        item = types_pb2.Item(name=request.name, size=types_pb2.LARGE,\n"
        "            added=timestamp_pb2.Timestamp(seconds=1), cents=5)\n"
        "        item.stock['x'] = 3\n"
        "        item.tags.append(types_pb2.Item.Tag(label='new'))\n"
        "        if item.WhichOneof('price') == 'cents' and not item.HasField('note'):\n"
        "            item.note = 'cheap'\n"
        "        return item\n\n"
        "def use(c: shop_topspin.ShopClient) -> int:\n"
        "    n = 0\n"
        "    for item in c.List(shop_pb2.Find(name='a')):\n"
        "        n += item.stock['x'] + item.added.seconds\n"
        "    size: types_pb2.Size.ValueType = c.Get(shop_pb2.Find()).size\n"
        "    return n + size\n"
        "\n"
        "bad = types_pb2.Item(size='LARGE')\n"  # the one wrong line
    )
    (tmp_path / "use.py").write_text(use)
    bad_line = use.splitlines().index("bad = types_pb2.Item(size='LARGE')") + 1
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", "mypy.ini", "use.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(gen)},
        check=False,
    )
    lines = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert len(lines) == 1 and lines[0].startswith(f"use.py:{bad_line}:"), r.stdout + r.stderr
