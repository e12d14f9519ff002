"""A batch handler is called with its list of items (after `ctx` with takes_context=True): one
that cannot take that call is refused at the decorator, by name, not at every job's run."""

from __future__ import annotations

from typing import Any

import pytest

from jobqueue import BatchContext, BatchItem, job
from jobqueue.exceptions import InvalidOption


def no_items() -> list[Any]:
    return []


def ctx_only(ctx: BatchContext) -> list[Any]:
    return []


def two_required(items: list[BatchItem], other: int) -> list[Any]:
    return []


@pytest.mark.parametrize(
    ("func", "context"),
    [(no_items, False), (ctx_only, True), (two_required, False)],
    ids=["no parameter", "ctx and no items", "a second required parameter"],
)
def test_a_batch_handler_that_cannot_take_its_items_is_refused_at_the_decorator(
    func: Any, context: bool
) -> None:
    with pytest.raises(InvalidOption, match=r"tests\.bad_batch_call: a batch handler is called"):
        job(name="tests.bad_batch_call", batch=5, takes_context=context)(func)


def test_a_batch_handler_that_takes_its_items_is_registered() -> None:
    def fine(ctx: BatchContext, items: list[BatchItem], *, extra: int = 0) -> list[Any]:
        return []

    async def also(items: list[BatchItem]) -> list[Any]:
        return []

    assert job(name="tests.fine_batch", batch=5, takes_context=True)(fine).options.batch == 5
    assert job(name="tests.also_batch", batch=5)(also).options.batch == 5
