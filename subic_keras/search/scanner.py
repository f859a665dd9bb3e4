"""`Scanner`: what ranks a `CodeStore` for real queries `z*`, and its helpers.

A scanner returns the top-`k` positions of the store and their exact scores
`sum_m z*[m*K + c_m]` (paper Sec. 3.3, Eq. 8), best first, equal scores by
position, among every item or, given `keep` (one boolean per position),
among the items it keeps. It keeps its own layout of the codes, made anew
on the first search after the store changed (`scanners` lists them).
"""

from __future__ import annotations

import abc
import threading

import numpy as np

from subic_keras.search import native
from subic_keras.search.store import CodeStore


class Scanner(abc.ABC):
    """Ranks a `CodeStore`; keeps a layout of it in step with its versions."""

    name: str

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.nbits = block_size.bit_length() - 1
        self._synced = (-1, -1, 0)  # store version, removals, rows laid out
        self._sync_lock = threading.Lock()  # searches run in parallel

    def search(
        self,
        store: CodeStore,
        queries: np.ndarray,
        k: int,
        keep: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top `k` scores and positions of each query, best first.

        `k` is at most the number of items searched: `store.size`, or the
        count of `keep`'s true values (one boolean per position).
        """
        with self._sync_lock:
            version, removals, rows = self._synced
            if version != store.version:
                start = rows if removals == store.removals else 0
                self._lay_out(store, start)
                self._synced = (store.version, store.removals, store.size)
        if keep is not None and keep.all():
            keep = None
        return self._search(store, queries, k, keep)

    def lay_out(
        self, store: CodeStore, groups: tuple[np.ndarray, np.ndarray] | None = None
    ) -> None:
        """Lays the store out now rather than on the first search.

        Args:
            store: the codes.
            groups: the grouping of the store's equal codes an index file
                held (`grouping`'s), which spares the native scan finding
                it (other scanners have no use for it); None: found now,
                where the scanner groups.
        """
        with self._sync_lock:
            if groups is None:
                self._lay_out(store, 0)
            else:
                self._lay_out_grouped(store, groups)
            self._synced = (store.version, store.removals, store.size)
        if store.size:
            # One search of a query like a model's (non-negative), as TF
            # Serving's warm-up requests do: the first search a user makes
            # then costs what the next ones do, not twice as much.
            rng = np.random.default_rng(0)
            width = self.num_blocks * self.block_size
            query = np.maximum(rng.standard_normal((1, width)), 0).astype(np.float32)
            self._search(store, query, min(10, store.size), None)

    def grouping(self, store: CodeStore) -> tuple[np.ndarray, np.ndarray] | None:
        """The grouping of the store's equal codes for an index file to keep
        (`native.group_equal`'s `(starts, members)`); None where codes hardly
        repeat or the native scan is not built."""
        if not native.kernels():
            return None
        grouped = native.group_equal(store.packed())
        return None if grouped is None else grouped[1:]

    def _lay_out_grouped(
        self, store: CodeStore, groups: tuple[np.ndarray, np.ndarray] | None
    ) -> None:
        """`lay_out`'s layout: `_lay_out` unless the scanner uses `groups`."""
        self._lay_out(store, 0)

    @abc.abstractmethod
    def _lay_out(self, store: CodeStore, start: int) -> None:
        """Lays out the store's rows; those before `start` are laid out already."""

    @abc.abstractmethod
    def _search(
        self, store: CodeStore, queries: np.ndarray, k: int, keep: np.ndarray | None
    ):
        """`search` once the layout is in step."""
