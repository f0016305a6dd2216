"""Real-life behaviour: fork, interpreter shutdown with live channels, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import GEN
from kv.v1 import kv_pb2, kv_topspin

import topspin


def test_fork_child_gets_a_clear_error_and_new_channels_work(kv_server: str) -> None:
    ch = topspin.Channel(kv_server)
    c = kv_topspin.StoreClient(ch)
    c.Put(kv_pb2.PutRequest(key="forked", value="1"))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            try:
                c.Get(kv_pb2.GetRequest(key="forked"))
            except RuntimeError as e:
                if "fork" in str(e):
                    c2 = kv_topspin.StoreClient(topspin.Channel(kv_server))
                    if c2.Get(kv_pb2.GetRequest(key="forked"), timeout=10).value == "1":
                        code = 0
        finally:
            os.write(w, bytes([code]))
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    assert os.read(r, 1) == b"\x00"
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's channel still works.
    assert c.Get(kv_pb2.GetRequest(key="forked")).value == "1"


def script(body: str) -> list[str]:
    code = f"import sys; sys.path.insert(0, {GEN!r})\n" + textwrap.dedent(body)
    return [sys.executable, "-c", code]


# The tests that send SIGINT expect what a Python program started from a terminal gets: SIGINT
# raises KeyboardInterrupt. But an ignored signal stays ignored across fork and exec, and a
# Python started with SIGINT ignored keeps it ignored (as it should: whoever started it wanted
# that). Under `nohup ./scripts/test.sh &` — a background job of a non-interactive shell, which
# ignores SIGINT for what it starts — pytest and so its children start that way. subprocess's
# restore_signals does not cover SIGINT (only SIGPIPE, SIGXFZ and SIGXFSZ), and preexec_fn is
# unsafe with the runtime's threads in this process: so the child, a Python, puts Python's
# default handler back itself before anything else.
DEFAULT_SIGINT = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"


def with_default_sigint(argv: list[str]) -> list[str]:
    """ARGV (a Python program: sys.executable, a script or -c code, its arguments), run with
    SIGINT's default handler whatever this process inherited."""
    exe, first, *rest = argv
    if first == "-c":
        return [exe, "-c", DEFAULT_SIGINT + rest[0], *rest[1:]]
    # As `python SCRIPT ARGS...` does: argv, sys.path[0], __main__.
    run = (
        "import os, runpy, sys\n"
        "sys.argv[0] = sys.argv.pop(1)\n"
        "sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    return [exe, "-c", DEFAULT_SIGINT + run, first, *rest]


def test_exit_with_live_channels_and_calls_does_not_hang(kv_server: str) -> None:
    body = f"""
        import asyncio, threading, topspin
        from kv.v1 import kv_pb2, kv_topspin
        c = kv_topspin.StoreClient(topspin.Channel({kv_server!r}))
        c.Put(kv_pb2.PutRequest(key="a"))
        w = c.Watch(kv_pb2.WatchRequest(include_existing=True))  # an open stream
        next(w)
        # a thread blocked in a call when the interpreter exits
        threading.Thread(target=lambda: next(c.Watch(kv_pb2.WatchRequest(prefix="zz"))),
                         daemon=True).start()
        async def main():
            a = kv_topspin.StoreAsyncClient(topspin.AsyncChannel({kv_server!r}))
            await a.Get(kv_pb2.GetRequest(key="a"))
            s = a.Watch(kv_pb2.WatchRequest(prefix="zz"))
            asyncio.ensure_future(s.__anext__())
            await asyncio.sleep(0.05)
        asyncio.run(main())
        # a Python server left running, with a handler busy in a call
        class Slow(kv_topspin.StoreServicer):
            def Get(self, request, context):
                import time; time.sleep(30)
        server = topspin.Server()
        kv_topspin.add_StoreServicer_to_server(Slow(), server)
        addr = server.start("tcp://127.0.0.1:0")
        sc = kv_topspin.StoreClient(topspin.Channel(addr))
        threading.Thread(target=lambda: sc.Get(kv_pb2.GetRequest(key="x")), daemon=True).start()
        import time; time.sleep(0.2)
        print("bye", flush=True)
    """
    t0 = time.monotonic()
    r = subprocess.run(script(body), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "bye"
    assert time.monotonic() - t0 < 30


def test_ctrl_c_interrupts_a_blocking_call(kv_server: str) -> None:
    body = f"""
        import topspin, time
        from kv.v1 import kv_pb2, kv_topspin
        c = kv_topspin.StoreClient(topspin.Channel({kv_server!r}))
        c.Put(kv_pb2.PutRequest(key="a"))
        w = c.Watch(kv_pb2.WatchRequest(prefix="never"))
        print("waiting", flush=True)
        try:
            next(w)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            # The channel goes on after the interrupted call.
            print(c.Get(kv_pb2.GetRequest(key="a"), timeout=10).key, flush=True)
    """
    p = subprocess.Popen(
        with_default_sigint(script(body)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "waiting"
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert out.split() == ["interrupted", "a"]


@pytest.mark.parametrize("kind", ["unary"])
def test_server_process_exits_on_sigint(kind: str) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    ex = os.path.join(os.path.dirname(here), "examples", "kv_server.py")
    env = dict(os.environ, PYTHONPATH=GEN)
    p = subprocess.Popen(
        with_default_sigint([sys.executable, ex, "tcp://127.0.0.1:0"]),
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.startswith("listening on"), line
    p.send_signal(signal.SIGINT)
    assert p.wait(30) == 0
