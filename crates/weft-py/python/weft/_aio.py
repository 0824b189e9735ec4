"""What the native module needs from Python: an ``__anext__`` that cannot lose a delta, and
the coroutines of its awaitables, which raise their errors out of the box they come in."""

import weakref

from ._weft import _Failed


_iterating: set = set()


async def next_delta(gen):  # type: ignore[no-untyped-def]
    """``Generation.__anext__``: wait until the next delta is made, then take it. The take has
    no ``await`` before it, so a cancellation (``asyncio.wait_for``'s timeout) can only fall
    while waiting, and a delta made by then stays held for the next call. A second
    ``__anext__`` while one waits raises, as an async generator's does (it used to end the
    second consumer's stream early)."""
    key = id(gen)
    if key in _iterating:
        raise RuntimeError("anext(): the generation is already being iterated by another task")
    _iterating.add(key)
    try:
        await gen._ready()
        return gen._take()
    finally:
        _iterating.discard(key)


async def start_when_awaited(start):  # type: ignore[no-untyped-def]
    """An awaitable made before any event loop ran (``asyncio.run(g.atext())``): ``start()``
    makes the asyncio future of the work, in the loop that awaits this coroutine."""
    return _opened(await start())


def started(fut):  # type: ignore[no-untyped-def]
    """An awaitable made inside a running event loop: ``fut``, the asyncio future of work that
    has already started, as a coroutine (``asyncio.create_task`` and ``TaskGroup`` take
    coroutines only). A coroutine dropped without being awaited (a forgotten ``await``)
    cancels its work, as asyncio's own would never start it; it used to run on, then fail to
    hand its result to a loop closed by then, with a traceback from a runtime thread."""
    coro = _started(fut)
    weakref.finalize(coro, _cancel_unless_done, fut)
    return coro


async def _started(fut):  # type: ignore[no-untyped-def]
    return _opened(await fut)


def _cancel_unless_done(fut):  # type: ignore[no-untyped-def]
    """Cancels ``fut`` (whose cancellation drops the work's Rust future) in its loop, unless
    it is done or the loop is gone."""
    loop = fut.get_loop()
    if fut.done() or loop.is_closed():
        return
    try:
        loop.call_soon_threadsafe(fut.cancel)
    except RuntimeError:  # the loop closed meanwhile
        pass


def _opened(outcome):  # type: ignore[no-untyped-def]
    """The value of an awaitable's future, or its error raised (see ``_Failed``)."""
    if type(outcome) is _Failed:
        outcome.raise_()
    return outcome
