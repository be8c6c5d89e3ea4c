"""A task whose first step runs now, in the caller's turn (Python 3.12's eager tasks, for 3.11).

    task = eager_task(coro, context=ctx)

`coro` runs at once, up to its first real suspension (a future not yet done), as the returned
task (`asyncio.current_task()` is that task, as in 3.12) and inside `context` (default: a copy
of the caller's, as `create_task`'s); the rest runs on as that ordinary task. A coroutine that
finishes without suspending gives a task that ends on the loop's next turn with its result.

Why: `asyncio.create_task` starts a coroutine only on the loop's next turn, after every
callback already waiting, so each task between a request's arrival and its offer to a worker
added one turn of the loop and whatever work was queued in it (the edge's set-up, the
hand-over's first step) to the first token. With the first steps eager, admission's call to
the queue (QueueShell.take) reaches the router's offer in the same turn, and the rest of the
process's work for the request runs while the worker prefills.

The rest is driven as `yield from` drives a sub-coroutine (PEP 380): each future the coroutine
waits on is handed to the task, and what the task sends or throws in (a result, a
cancellation) goes on to the coroutine. So the task is cancelled, and its coroutine sees the
cancellation, exactly as an ordinary task's would. On 3.12+ asyncio's own eager start is used.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextvars
import sys
from asyncio import tasks
from collections.abc import Coroutine, Generator
from typing import Any


def eager_task(coro: Coroutine, *, context: contextvars.Context | None = None) -> asyncio.Task:
    loop = asyncio.get_running_loop()
    ctx = context if context is not None else contextvars.copy_context()
    if sys.version_info >= (3, 12):  # asyncio's own
        return asyncio.Task(coro, loop=loop, context=ctx, eager_start=True)
    resumed = _Resumed(coro)
    task = loop.create_task(resumed, context=ctx)  # its first turn comes after the step below
    caller = tasks.current_task(loop)
    if caller is not None:
        tasks._leave_task(loop, caller)
    tasks._enter_task(loop, task)
    try:
        resumed.first = ctx.run(_first_step, coro)
    finally:
        tasks._leave_task(loop, task)
        if caller is not None:
            tasks._enter_task(loop, caller)
    return task


def _first_step(coro: Coroutine) -> tuple[str, Any]:
    try:
        return "yielded", coro.send(None)
    except StopIteration as done:
        return "returned", done.value
    except BaseException as e:  # noqa: BLE001 — the coroutine's own: raised by its task, as a task's would be
        return "raised", e


class _Resumed(collections.abc.Coroutine):
    """`coro` after its first step (`first`: what that step did), as the task's coroutine: the
    task's first `send` gets what the step yielded (the future it waits on) or its end; every
    later send and throw goes to `coro` itself, as `yield from` would pass them."""

    __slots__ = ("coro", "first")

    def __init__(self, coro: Coroutine) -> None:
        self.coro = coro
        self.first: tuple[str, Any] | None = None

    def send(self, value: Any) -> Any:
        if self.first is None:
            return self.coro.send(value)
        (how, got), self.first = self.first, None
        if how == "raised":
            raise got
        if how == "returned":
            raise StopIteration(got)
        return got  # the future the first step waits on: the task waits on it

    def throw(self, typ, val=None, tb=None) -> Any:  # noqa: ANN001 — the coroutine protocol's
        if self.first is not None:  # cancelled before its first turn
            (how, _), self.first = self.first, None
            if how != "yielded":  # over already: the task ends with what is thrown in
                raise typ if val is None else val
        return self.coro.throw(typ, val, tb) if val is not None or tb is not None else self.coro.throw(typ)

    def close(self) -> None:
        self.first = None
        self.coro.close()

    def __await__(self) -> Generator[Any, Any, Any]:
        return self  # an iterator with send and throw, as a coroutine's own `__await__` gives

    def __iter__(self):  # noqa: ANN204
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def __getattr__(self, name: str) -> Any:
        """What a task's inspection reads (Task.get_stack, service.await_chain: cr_frame,
        cr_await; a coroutine's __name__, __qualname__) is the coroutine's own."""
        if name in _Resumed.__slots__:  # not yet set
            raise AttributeError(name)
        return getattr(self.coro, name)
