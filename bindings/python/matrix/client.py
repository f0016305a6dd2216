"""The Python clients of the cross-language matrix (testdata/matrix/README.md).

    python matrix/client.py --mode sync|asyncio [--ca FILE] --target ADDR

Runs the README's checks in order against the server at ADDR with the blocking client
(`--mode sync`, checks_sync.py) or the asyncio client (`--mode asyncio`, checks_asyncio.py),
printing `ok NAME` or `FAIL NAME: why` for each; exits 0 when every check passed, else 1.
A tls:// or wss:// server's certificate must chain to the CAs of `--ca FILE` (PEM), trusted
instead of the webpki roots.
Each check has its own 5 s deadline, so the run ends within 60 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from types import FrameType
from typing import Optional

import common

common.load_generated()
import checks_asyncio  # noqa: E402
import checks_sync  # noqa: E402


class CheckTimeout(BaseException):
    """A check's own deadline passed (raised by SIGALRM, also out of a blocking call)."""


def report(name: str, error: Optional[BaseException]) -> bool:
    if error is None:
        print(f"ok {name}", flush=True)
        return True
    why = common.one_line(error)
    if not isinstance(error, (common.Failed, CheckTimeout)):
        why = f"{type(error).__name__}: {why}"
    print(f"FAIL {name}: {why}", flush=True)
    return False


def on_alarm(signum: int, frame: Optional[FrameType]) -> None:
    raise CheckTimeout(f"no result within {common.CHECK_SECONDS:g} s")


def run_sync(target: str, ca: Optional[str]) -> bool:
    """The blocking client's checks, on the main thread; SIGALRM ends a check that overruns
    its deadline (a blocking call sees the signal and is cancelled)."""
    checks = checks_sync.Checks(target, lambda c: common.tag("sync", c), ca)
    signal.signal(signal.SIGALRM, on_alarm)
    passed = True
    for name in common.CHECKS:
        error: Optional[BaseException] = None
        signal.setitimer(signal.ITIMER_REAL, common.CHECK_SECONDS)
        try:
            checks_sync.check(checks, name)()
        except (Exception, CheckTimeout) as e:  # noqa: B902 - every failure is reported
            error = e
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        passed = report(name, error) and passed
    return passed


async def run_asyncio(target: str, ca: Optional[str]) -> bool:
    """The asyncio client's checks, each under `asyncio.wait_for` with its deadline."""
    checks = checks_asyncio.Checks(target, lambda c: common.tag("asyncio", c), ca)
    passed = True
    for name in common.CHECKS:
        error: Optional[BaseException] = None
        try:
            await asyncio.wait_for(checks_asyncio.check(checks, name)(), common.CHECK_SECONDS)
        except asyncio.TimeoutError:
            error = CheckTimeout(f"no result within {common.CHECK_SECONDS:g} s")
        except Exception as e:
            error = e
        passed = report(name, error) and passed
    return passed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("sync", "asyncio"), required=True)
    ap.add_argument("--target", required=True, metavar="ADDR")
    ap.add_argument("--ca", metavar="FILE", help="CA certificates (PEM) of tls:// and wss://")
    a = ap.parse_args()
    common.setup_tracing()  # for the `trace` check
    ok = run_sync(a.target, a.ca) if a.mode == "sync" else asyncio.run(run_asyncio(a.target, a.ca))
    # Exit without waiting for anything a check that overran may have left blocked.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    sys.exit(main())
