"""Event-loop choice for corral's servers and agents."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (it is with uvicorn[standard]), as uvicorn itself would choose."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
