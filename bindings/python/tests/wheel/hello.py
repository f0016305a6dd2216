"""The wheel check (scripts/test-python.sh): run in a fresh venv that has only the
topspin-rpc wheel and protobuf, after `topspin-gen -I . hello.proto -o gen`.

Checks that `topspin` is imported from that venv (not a checkout), the distribution's metadata
(name, licence, its files, the console script), and a server with blocking and asyncio calls.
"""

import asyncio
import sys
from importlib.metadata import distribution
from pathlib import Path
from typing import Iterator

sys.path.insert(0, "gen")
import hello_pb2  # noqa: E402
import hello_topspin  # noqa: E402

import topspin  # noqa: E402

here = Path(topspin.__file__).resolve()
assert Path(sys.prefix).resolve() in here.parents, f"topspin imported from {here}"
dist = distribution("topspin-rpc")
assert dist.metadata["License-Expression"] == "MIT OR Apache-2.0", dist.metadata
files = {f.name for f in dist.files or []}
assert {"LICENSE-MIT", "LICENSE-APACHE", "_native.abi3.so"} <= files, files
scripts = {e.name: e.value for e in dist.entry_points if e.group == "console_scripts"}
assert scripts == {"topspin-gen": "topspin.gen:cli"}, scripts


class Greeter(hello_topspin.GreeterServicer):
    def SayHello(
        self, request: hello_pb2.HelloRequest, context: topspin.ServicerContext
    ) -> hello_pb2.HelloReply:
        return hello_pb2.HelloReply(message=f"hello {request.name}")

    def SayHellos(
        self, request: hello_pb2.HelloRequest, context: topspin.ServicerContext
    ) -> Iterator[hello_pb2.HelloReply]:
        for i in range(request.count):
            yield hello_pb2.HelloReply(message=f"hello {request.name} {i}")


server = topspin.Server()
hello_topspin.add_GreeterServicer_to_server(Greeter(), server)
address = server.start("tcp://127.0.0.1:0")
try:
    client = hello_topspin.GreeterClient(topspin.Channel(address))
    reply = client.SayHello(hello_pb2.HelloRequest(name="wheel"), timeout=10)
    assert reply.message == "hello wheel", reply
    replies = [r.message for r in client.SayHellos(hello_pb2.HelloRequest(name="w", count=3))]
    assert replies == ["hello w 0", "hello w 1", "hello w 2"], replies

    async def main() -> None:
        aclient = hello_topspin.GreeterAsyncClient(topspin.AsyncChannel(address))
        r = await aclient.SayHello(hello_pb2.HelloRequest(name="asyncio"), timeout=10)
        assert r.message == "hello asyncio", r

    asyncio.run(main())
finally:
    server.stop(grace=5)
print(f"wheel: topspin-rpc {dist.version} from {here.parent}: calls OK")
