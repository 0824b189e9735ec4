"""What the native module needs from Python: an ``__anext__`` that cannot lose a delta, and
the coroutines of its awaitables, which raise their errors out of the box they come in."""

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


async def started(fut):  # type: ignore[no-untyped-def]
    """An awaitable made inside a running event loop: ``fut``, the asyncio future of work that
    has already started, as a coroutine (``asyncio.create_task`` and ``TaskGroup`` take
    coroutines only)."""
    return _opened(await fut)


def _opened(outcome):  # type: ignore[no-untyped-def]
    """The value of an awaitable's future, or its error raised (see ``_Failed``)."""
    if type(outcome) is _Failed:
        outcome.raise_()
    return outcome
