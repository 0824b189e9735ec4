r"""weft: a fast, CPU-first, programmable LLM inference engine.

Load a model into an :class:`Engine`, make :class:`Context` objects on it and drive them with
``ctx.generate(...)`` (an iterator, sync and async, of text deltas) or ``ctx.forward()`` (one
pass: inputs, samplers and probes at any position). Every context of one engine shares its
model calls, whichever thread or asyncio task drives it::

    import weft
    engine = weft.Engine("smollm2-135m")
    ctx = engine.context()
    ctx.fill("The capital of France is")
    print(ctx.generate(weft.Argmax(), max_tokens=8).text())  # " Paris.\n\nThe United States"
"""

from ._weft import *  # noqa: F401,F403
from ._weft import __all__, __version__  # noqa: F401

import atexit as _atexit

from ._weft import _quiesce

# Let the async runtime's threads leave Python before the interpreter finalizes.
_atexit.register(_quiesce)
del _atexit
