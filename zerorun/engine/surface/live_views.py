"""Read-only sequences and mappings computed afresh at each access, for DeepSpeed's optimizer attributes.

DeepSpeed's optimizer holds its buffers in lists and dicts it updates in place; zerorun's engine holds the
same state in its buckets, masters and reducers, and a tensor there may be replaced (``offload_states``
moves it off the device and back). A view that reads the engine at each access is never stale, and holds
nothing alive: subclasses keep their engine weakly and give :meth:`_live`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Generic, TypeVar, overload

K = TypeVar("K")
T = TypeVar("T")


class LiveSequence(Sequence[T], Generic[T]):
    """A sequence whose items are :meth:`_live`'s, read at each access."""

    def _live(self) -> list[T]:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        return self._live()[index]

    def __len__(self) -> int:
        return len(self._live())

    def __iter__(self) -> Iterator[T]:
        return iter(self._live())


class LiveMapping(Mapping[K, T], Generic[K, T]):
    """A mapping whose items are :meth:`_live`'s, read at each access."""

    def _live(self) -> dict[K, T]:
        raise NotImplementedError

    def __getitem__(self, key: K) -> T:
        return self._live()[key]

    def __len__(self) -> int:
        return len(self._live())

    def __iter__(self) -> Iterator[K]:
        return iter(self._live())
