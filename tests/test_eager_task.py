"""shared/eager.py: a task whose first step runs in the caller's turn — as that task, in its
own context — and whose rest runs as an ordinary task: results, errors and cancellations
(before its first turn, and while it waits) reach the caller and the coroutine as a plain
task's would."""

from __future__ import annotations

import asyncio
import contextvars

import pytest
from tokenyard.shared.eager import eager_task

where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="caller")


async def test_the_first_step_runs_before_the_call_returns_and_the_rest_on_the_loop():
    steps, gate = [], asyncio.Event()

    async def work() -> int:
        steps.append(("first", asyncio.current_task()))
        await gate.wait()
        steps.append(("rest", asyncio.current_task()))
        return 42

    task = eager_task(work())
    assert steps == [("first", task)]  # ran now, as the task itself (what asyncio.timeout needs)
    assert asyncio.current_task() is not task  # the caller is its own task again
    gate.set()
    assert await task == 42
    assert steps == [("first", task), ("rest", task)]


async def test_the_coroutine_runs_in_the_given_context_and_leaves_the_callers_alone():
    seen = []

    async def work() -> None:
        seen.append(where.get())
        where.set("task")
        await asyncio.sleep(0)
        seen.append(where.get())

    ctx = contextvars.copy_context()
    ctx.run(where.set, "given")
    await eager_task(work(), context=ctx)
    assert seen == ["given", "task"] and where.get() == "caller" and ctx[where] == "task"


async def test_a_coroutine_that_never_waits_ends_its_task_with_its_result_or_its_error():
    async def quick() -> str:
        return "done"

    async def broken() -> None:
        raise ValueError("bad input")

    assert await eager_task(quick()) == "done"
    failing = eager_task(broken())
    with pytest.raises(ValueError, match="bad input"):
        await failing


async def test_a_cancellation_reaches_the_coroutine_before_its_first_turn_and_while_it_waits():
    for yield_first in (False, True):
        seen: list[str] = []

        async def work(seen: list[str] = seen) -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            finally:
                seen.append("cleaned up")

        task = eager_task(work())
        if yield_first:
            await asyncio.sleep(0)  # the task has taken its first turn: it waits on the event
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled() and seen == ["cancelled", "cleaned up"], yield_first


async def test_a_task_inspection_reads_the_coroutines_own_name_and_frame():
    async def named_work() -> None:
        await asyncio.Event().wait()

    task = eager_task(named_work())
    try:
        coro = task.get_coro()
        assert coro.__name__ == "named_work" and coro.__qualname__.endswith("named_work")
        assert coro.cr_frame.f_code.co_name == "named_work"
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
