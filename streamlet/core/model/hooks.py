"""User hooks (a writer's ``write``, a reader's ``checkpoint_complete``, ...) may be plain or ``async def``."""

from __future__ import annotations

import inspect
from typing import Any


async def maybe_await(value: Any) -> Any:
    """``value``, awaited first when a hook returned an awaitable."""
    if inspect.isawaitable(value):
        return await value
    return value
