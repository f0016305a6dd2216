"""Code generation without protoc: the CLI, protoc-equivalent messages, typed stubs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import GEN, KV_PROTO_DIR, PKG

from topspin.gen import generate


def test_cli_writes_modules(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "topspin.gen",
            "-I",
            KV_PROTO_DIR,
            "kv/v1/kv.proto",
            "-o",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    for f in ("kv_pb2.py", "kv_pb2.pyi", "kv_topspin.py"):
        assert (tmp_path / "kv" / "v1" / f).exists()


def test_parse_error_is_reported(tmp_path: Path) -> None:
    (tmp_path / "bad.proto").write_text('syntax = "proto3";\nmessage A { int32 x = ; }\n')
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "topspin.gen",
            "-I",
            str(tmp_path),
            "bad.proto",
            "-o",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 1
    assert "bad.proto" in r.stderr


def test_messages_match_protoc(tmp_path: Path) -> None:
    """Our descriptor is the one protoc (grpcio-tools) embeds, so messages are identical."""
    protoc = pytest.importorskip("grpc_tools.protoc")
    out = tmp_path / "protoc"
    out.mkdir()
    rc = protoc.main(["protoc", f"-I{KV_PROTO_DIR}", f"--python_out={out}", "kv/v1/kv.proto"])
    assert rc == 0
    code = textwrap.dedent(
        """
        import importlib.util, sys
        from google.protobuf import descriptor_pb2
        def load(path):
            spec = importlib.util.spec_from_file_location("m", path)
            src = open(path).read()
            start = src.index("AddSerializedFile(") + len("AddSerializedFile(")
            end = src.index(")\\n", start)
            fd = descriptor_pb2.FileDescriptorProto.FromString(eval(src[start:end]))
            return fd
        a, b = load(sys.argv[1]), load(sys.argv[2])
        assert a == b, (a, b)
        print("same")
        """
    )
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            os.path.join(GEN, "kv", "v1", "kv_pb2.py"),
            str(out / "kv" / "v1" / "kv_pb2.py"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.stdout.strip() == "same", r.stderr


def test_generated_messages_are_protobuf_messages() -> None:
    from google.protobuf.message import Message
    from kv.v1 import kv_pb2

    e = kv_pb2.Entry(key="a", value="b", version=3)
    assert isinstance(e, Message)
    assert kv_pb2.Entry.FromString(e.SerializeToString()) == e
    assert kv_pb2.DESCRIPTOR.services_by_name["Store"].methods_by_name["Watch"].server_streaming


def test_function_for_build_scripts(tmp_path: Path) -> None:
    files = generate(["kv/v1/kv.proto"], [KV_PROTO_DIR], str(tmp_path))
    assert str(tmp_path / "kv" / "v1" / "kv_topspin.py") in files


def test_mypy_checks_calls_and_handlers(tmp_path: Path) -> None:
    bad = tmp_path / "bad_use.py"
    bad.write_text(
        textwrap.dedent(
            """
            import topspin
            from kv.v1 import kv_pb2, kv_topspin

            def f(c: kv_topspin.StoreClient) -> None:
                c.Get(kv_pb2.PutRequest(key="a"))          # wrong request type
                e: kv_pb2.PutResponse = c.Get(kv_pb2.GetRequest())  # wrong response type

            class S(kv_topspin.StoreServicer):
                def Get(self, request: kv_pb2.PutRequest,  # wrong handler signature
                        context: topspin.ServicerContext) -> kv_pb2.Entry:
                    return kv_pb2.Entry()
            """
        )
    )
    env = dict(os.environ, MYPYPATH=GEN)
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", str(bad)],
        capture_output=True,
        text=True,
        env=env,
        cwd=PKG,
        check=False,
    )
    assert r.returncode == 1, r.stdout
    assert r.stdout.count("error:") == 3, r.stdout
