"""One completer per asyncio loop: the Rust side queues results, the loop sets them."""

from __future__ import annotations

import asyncio
import weakref

from . import _native

_completers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _native.Completer]" = (
    weakref.WeakKeyDictionary()
)


def completer(loop: asyncio.AbstractEventLoop) -> _native.Completer:
    """The completer of `loop`, registered with it on first use."""
    c = _completers.get(loop)
    if c is None:
        c = _native.Completer()
        loop.add_reader(c.fileno(), c.drain)
        _completers[loop] = c
    return c
