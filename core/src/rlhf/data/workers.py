"""``--data.dataloader_num_workers``: data preparation in torch DataLoader worker processes.

The work is split into items that are computed independently and handed back in their
order, so any number of workers gives exactly what 0 workers (the calling process) gives.
Workers are forked from the caller, so the function may use the caller's tokenizer and
config. A user error raised in a worker (a bad row) is handed back and raised in the
caller unchanged, one line as always; anything else keeps DataLoader's report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rlhf.errors import UserError

#: The plugin API (docs/plugin-api.md); the module's other names may change in any release.
__all__ = ["computed_in_order"]


class _Computed:
    """A map-style dataset whose item ``i`` is ``function(items[i])`` (a user error is returned, not raised)."""

    def __init__(self, function: Callable[[Any], Any], items: Sequence[Any]) -> None:
        self.function, self.items = function, items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.function(self.items[index])
        except UserError as error:
            return _Failed(error)


class _Failed:
    def __init__(self, error: UserError) -> None:
        self.error = error


def _as_is(item: Any) -> Any:
    return item


def computed_in_order(function: Callable[[Any], Any], items: Sequence[Any], workers: int, prefetch: int = 2) -> Iterator[Any]:
    """``function(item)`` for each of ``items``, in order; with ``workers`` > 0 computed ahead in that many
    DataLoader worker processes (``prefetch`` items each), else lazily in this process."""
    if workers <= 0:
        yield from (function(item) for item in items)
        return
    from torch.utils.data import DataLoader

    loader = DataLoader(_Computed(function, items), batch_size=None, shuffle=False, num_workers=workers,
                        collate_fn=_as_is, prefetch_factor=prefetch, multiprocessing_context="fork")
    for result in loader:
        if isinstance(result, _Failed):
            raise result.error
        yield result


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[start : start + size] for start in range(0, len(items), max(1, size))]
