"""The README's quick start, run as written (from bindings/python, in a temporary copy)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import KV_PROTO_DIR, PKG, ROOT, binary, grpcurl, start_server


def test_quick_start(tmp_path: Path) -> None:
    text = (Path(PKG) / "README.md").read_text()
    quick = text.split("## Quick start", 1)[1].split("## What there is", 1)[0]
    shells = re.findall(r"```sh\n(.*?)```", quick, re.S)
    code = re.findall(r"```python\n(.*?)```", quick, re.S)
    assert len(code) == 1 and len(shells) == 2
    gen = [ln for ln in shells[0].splitlines() if "topspin-gen" in ln]
    assert len(gen) == 1
    # `cd bindings/python` of the README: the same relative paths from a directory as deep.
    work = tmp_path / "bindings" / "python"
    work.mkdir(parents=True)
    (tmp_path / "examples").symlink_to(os.path.join(ROOT, "examples"))
    argv = shlex.split(gen[0])
    assert argv[0] == ".venv/bin/topspin-gen"
    # The console script of the environment running the tests (the set-up's venv, or a venv
    # the wheel was installed into).
    script = Path(sys.executable).parent / "topspin-gen"
    r = subprocess.run([str(script), *argv[1:]], cwd=work, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (work / "quickstart.py").write_text(code[0])
    run = shlex.split(shells[1].split("#")[0])
    assert run == [".venv/bin/python", "quickstart.py"]
    r = subprocess.run(
        [sys.executable, "quickstart.py"], cwd=work, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["red", "NOT_FOUND no key 'pear'", "64 answers"]


def section_example(heading: str, tmp_path: Path, name: str) -> str:
    """The README section `heading`'s one Python block, written to `tmp_path/name` beside the
    kvstore code it imports; returns the section's one shell block."""
    text = (Path(PKG) / "README.md").read_text()
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.*?)```", section, re.S)
    shells = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(code) == 1 and len(shells) == 1
    from topspin.gen import generate

    generate(["kv/v1/kv.proto"], [KV_PROTO_DIR], str(tmp_path / "gen_out"))
    (tmp_path / name).write_text(code[0])
    return str(shells[0])


def test_interceptors_example(tmp_path: Path) -> None:
    shell = section_example("Interceptors", tmp_path, "serve.py")
    run, said = shell.split("#", 1)
    assert shlex.split(run) == [".venv/bin/python", "serve.py"]
    r = subprocess.run(
        [sys.executable, "serve.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    # The README's comment, with any duration.
    want = [re.escape(x).replace(r"1\.5", r"\d+\.\d") for x in said.strip().split(" / ")]
    got = r.stdout.splitlines()
    assert len(got) == len(want) and all(re.fullmatch(w, g) for w, g in zip(want, got)), got


def test_opentelemetry_example(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk")
    shell = section_example("OpenTelemetry", tmp_path, "traced.py")
    run, said = shell.split("#", 1)
    assert shlex.split(run) == [".venv/bin/python", "traced.py"]
    r = subprocess.run(
        [sys.executable, "traced.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == said.strip().split(" / ")


def test_health_and_reflection_example(tmp_path: Path) -> None:
    shell = section_example("Health and reflection", tmp_path, "health_server.py")
    lines = shell.strip().splitlines()
    assert shlex.split(lines[0]) == [".venv/bin/python", "health_server.py", "&"]
    # The server on a free port (the README's 50051 may be taken): the commands call that.
    p, bound = start_server([sys.executable, "health_server.py", "tcp://127.0.0.1:0"], tmp_path)
    tools = {"grpcurl": grpcurl(), "topspin": binary("topspin")}
    try:
        for line in lines[1:]:
            command, said = line.split("#", 1)
            argv = [
                a.replace("127.0.0.1:50051", bound.split("://", 1)[1]) for a in shlex.split(command)
            ]
            r = subprocess.run(
                [tools[argv[0]], *argv[1:]], capture_output=True, text=True, timeout=30
            )
            assert r.returncode == 0, (line, r.stderr)
            for want in said.strip().split(" / "):
                assert want in r.stdout, (line, r.stdout)
    finally:
        p.terminate()
        p.wait(10)
