"""SuBiC search on Milvus: Milvus Lite at a local path, or a Milvus cluster.

Each item is stored as its code's sparse one-hot vector (`M` non-zeros, a 1
at `m*K + c_m`) in a `SPARSE_INVERTED_INDEX` with inner-product metric. The
inner product of a query `z*` with that vector is SuBiC's score,
`sum_m z*[m*K + c_m]` (paper Sec. 3.3, Eq. 8), so Milvus's search is exact
(scores summed in float32). The same code talks to Milvus Lite (a local
`.db` file, embedded, no server) and to a Milvus server or cluster
(`http://host:19530`): distributed storage, replicas and filtering by
fields come from Milvus itself. A collection made with `instance=(M', K')`
keeps each item's instance code (`subic_keras.instance.instance_code`) in a second
vector field, searched by `by_instance()` with the same conventions; one of
a folder's pictures is a `milvus_pictures.MilvusPictures`.

A collection records `M`, `K` and its format's version in its properties
(`milvus_schema`), checked when it is opened, with the next default id and
insertion counter. Differences from `SubicIndex`, by Milvus's design:

- Milvus takes non-negative weights only: a block of the query with
  negative entries (the class-posterior query has them) is raised by a
  constant so that its least entry is 0, which raises every item's score
  alike, and the scores returned have it taken off again, so every query
  ranks as with `SubicIndex`.
- Items whose code meets no non-zero entry of the (raised) query are not
  returned; a row holding fewer results than `min(k, len(index))` is padded
  with id -1 and score -inf (`subic_keras.search.base`).
- `k` is at most 16,384 (Milvus's `topk` limit).
- Returned rows are sorted by score, equal scores by insertion order, but
  which of several items tied at the k-th score are returned is Milvus's
  choice.
- Writes: `add` checks that its ids are new, then inserts, then records
  its counters; a failed insert deletes what it inserted, and rows that a
  killed process inserted without recording them are found and counted
  when an opened index first reads or writes (`_counters`), so ids are
  never reused. Writers in one process take turns (a lock per collection,
  shared by every `MilvusIndex`); writers in several processes are not
  (Milvus does not enforce unique primary keys): give each its own ids.
- Milvus's errors are raised as `MilvusError` (an `OSError`) naming the URI
  and the collection.

pymilvus is an optional dependency: `pip install "subic-keras[milvus]"`.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from typing import Any

import numpy as np

from subic_keras._validation import check_int
from subic_keras.search import (
    filter_terms,
    filters,
    milvus_answers,
    milvus_client,
    milvus_schema,
)
from subic_keras.search.addresses import (
    check_database_exists,
    check_location,
    is_local,
)
from subic_keras.search.base import Searcher, answer_rows
from subic_keras.search.checks import (
    check_block_size,
    check_ids,
    check_model_record,
    check_num_blocks,
    check_queries,
    preview,
)
from subic_keras.search.instance_codes import checked_instance_queries, copy_margin_of
from subic_keras.search.milvus_client import (
    MilvusError as MilvusError,
)
from subic_keras.search.milvus_client import (
    get_rows,
    milvus_errors,
    pymilvus_module,
)

MAX_K = 16_384  # Milvus's topk limit


# One lock per collection of this process: writers through any number of
# `MilvusIndex` objects take turns, so two never draw the same ids.
_WRITE_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_WRITE_LOCKS_GUARD = threading.Lock()


def _write_lock(uri: str, collection: str) -> threading.Lock:
    key = (os.path.abspath(uri) if is_local(uri) else uri, collection)
    with _WRITE_LOCKS_GUARD:
        return _WRITE_LOCKS.setdefault(key, threading.Lock())


class MilvusIndex(Searcher):
    """SuBiC codes in a Milvus collection, searched asymmetrically.

    Example:

    >>> index = MilvusIndex("codes.db", "cifar48", num_blocks=8, block_size=64)
    >>> ids = index.add(np.random.default_rng(0).integers(0, 64, (1000, 8)))
    >>> z_star = np.random.default_rng(1).random((2, 8 * 64), dtype=np.float32)
    >>> scores, ids = index.search(z_star, k=10)
    >>> ids.shape
    (2, 10)
    >>> MilvusIndex("codes.db", "cifar48").num_blocks   # reopened: M, K stored
    8

    Args:
        uri: a local path ending in `.db` (Milvus Lite, embedded; it makes
            a folder there), or
            `http://host:19530` (a Milvus server or cluster).
        collection: the collection's name.
        num_blocks, block_size: `M` and `K`, needed to create the collection;
            when it exists they must match what it records (or be None).
        token: Milvus's credentials (`"user:password"` or an API key).
        timeout: seconds to wait for the server.
        shards: the collection's shards when it is created (Milvus's
            `num_shards`; default Milvus's, 1). A cluster spreads inserts
            over them.
        replicas: in-memory replicas to load the collection with (Milvus's
            `replica_number`, on a cluster with that many query nodes;
            default Milvus's, 1). Replicas serve searches in parallel.
        model: the model that writes the codes (`retrieval.model_record`),
            recorded by a new collection (property `subic.model`) and
            read back as `model`.
        instance: `(M', K')`: a new collection keeps an instance code of
            every item too, in a second sparse vector field
            (`milvus_schema`), given to `add` as `instance_codes` and
            searched through `by_instance()`.
        instance_model: the model that writes the instance codes, recorded
            as `model` is.

    Raises:
        ImportError: without pymilvus (the message says how to install it).
        ConnectionError: if Milvus cannot be reached at `uri`.
        ValueError: for a bad name or shape, a collection that is not a
            SuBiC collection, or one created with another `M` or `K`.
    """

    max_k = MAX_K  # Milvus's topk limit
    _query_chunk = 256
    _folder: tuple = (None, None)  # a new collection's root and image shape

    def __init__(
        self,
        uri: str | os.PathLike,
        collection: str,
        num_blocks: int | None = None,
        block_size: int | None = None,
        *,
        token: str = "",
        timeout: float = 10.0,
        shards: int | None = None,
        replicas: int | None = None,
        model: dict | None = None,
        instance: tuple[int, int] | None = None,
        instance_model: dict | None = None,
    ):
        pymilvus = pymilvus_module()
        model = check_model_record("model", model)
        instance_model = check_model_record("instance_model", instance_model)
        uri = check_location(uri, collection)
        self._shards = (
            None if shards is None else check_int("shards", shards, minimum=1)
        )
        self._replicas = (
            None if replicas is None else check_int("replicas", replicas, minimum=1)
        )
        if num_blocks is not None:
            num_blocks = check_num_blocks(
                check_int("num_blocks", num_blocks, minimum=1)
            )
        if block_size is not None:
            block_size = check_block_size(block_size)
        if instance is not None:
            instance = milvus_schema.check_instance(instance)
        if num_blocks is None or block_size is None:
            check_database_exists(uri, collection)
        self._uri, self._name = uri, collection
        self._view = False  # a view of the instance codes (`by_instance`)
        self._write = _write_lock(uri, collection)
        # The counters implied by rows past the recorded ones, once they
        # were looked for (`_counters`).
        self._floor: tuple[int, int] | None = None
        if is_local(uri):
            # Milvus Lite serves in-process and lacks AllocTimestamp, which
            # pymilvus calls and tolerates; grpc would log every such call
            # as an exception with a traceback.
            logging.getLogger("grpc._server").setLevel(logging.CRITICAL)
        try:
            self._client = milvus_client.open_client(uri, token, timeout)
            exists = self._client.has_collection(collection)
        except pymilvus.exceptions.MilvusException as error:
            raise ConnectionError(
                f"cannot reach Milvus at uri={uri!r}: {error}"
            ) from error
        if not exists and (num_blocks is None or block_size is None):
            milvus_client.close_client(self._client)  # frees a Lite file
            raise ValueError(
                f"collection {collection!r} does not exist at {uri!r} (it is "
                "made by `subic index build`, or given num_blocks and block_size)"
            )
        with milvus_errors(self._uri, self._name):
            if exists:
                self._open(num_blocks, block_size, instance)
            else:
                assert num_blocks is not None and block_size is not None
                self._recorded = milvus_schema.Recorded(
                    num_blocks, block_size, model, instance, instance_model,
                    *self._folder,
                )  # fmt: skip
                options = {} if self._shards is None else {"num_shards": self._shards}
                milvus_schema.create(
                    self._client, pymilvus, collection, self._recorded, options
                )
                if self._replicas is not None:
                    self._load()

    def _properties(self) -> dict:
        described = self._client.describe_collection(self._name)
        return dict(described.get("properties") or {})

    def _open(self, num_blocks, block_size, instance) -> None:
        recorded = milvus_schema.read(
            self._properties(), f"collection {self._name!r} at {self._uri!r}"
        )
        for name, given, stored in (
            ("num_blocks", num_blocks, recorded.num_blocks),
            ("block_size", block_size, recorded.block_size),
            ("instance", instance, recorded.instance),
        ):
            if given is not None and given != stored:
                raise ValueError(
                    f"collection {self._name!r} holds codes with {name}={stored}, "
                    f"received {name}={given}"
                )
        self._recorded = recorded
        # A collection is searchable once loaded (a new process, a restart).
        self._load()

    def _load(self) -> None:
        if self._replicas is None:
            self._client.load_collection(self._name)
        else:
            self._client.load_collection(self._name, replica_number=self._replicas)

    # Properties -----------------------------------------------------------

    @property
    def model(self) -> dict | None:
        """The model that wrote the codes searched, as the collection records
        it (a view's: the instance model; None where none was recorded)."""
        return self._recorded.instance_model if self._view else self._recorded.model

    @property
    def instance(self) -> tuple[int, int] | None:
        """`(M', K')` of the items' instance codes; None without them."""
        return self._recorded.instance

    @property
    def instance_model(self) -> dict | None:
        """The model that wrote the instance codes, as recorded (or None)."""
        return self._recorded.instance_model

    @property
    def num_blocks(self) -> int:
        return self._recorded.shape(self._view)[0]

    @property
    def block_size(self) -> int:
        return self._recorded.shape(self._view)[1]

    @property
    def uri(self) -> str:
        return self._uri

    @property
    def collection(self) -> str:
        return self._name

    def __len__(self) -> int:
        with milvus_errors(self._uri, self._name):
            rows = self._client.query(self._name, filter="", output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    @property
    def _vectors(self) -> str:
        """The vector field searched and read."""
        return milvus_schema.INSTANCE_CODE if self._view else milvus_schema.CODE

    def __repr__(self) -> str:
        return (
            f"MilvusIndex(uri={self._uri!r}, collection={self._name!r}, "
            f"num_blocks={self.num_blocks}, block_size={self.block_size})"
        )

    def by_instance(self) -> MilvusIndex:
        """The same items searched by their instance codes (the second
        vector field), for reading: `search` and `get_codes` read the
        instance codes, `add` and `remove` raise.

        Raises:
            ValueError: the collection keeps no instance codes.
        """
        if self.instance is None:
            raise ValueError(
                f"collection {self._name!r} keeps no instance codes; create it "
                "with instance=(num_blocks, block_size)"
            )
        view = copy.copy(self)
        view._view = True
        return view

    def close(self) -> None:
        """Closes the connection (and Milvus Lite's file); a view
        (`by_instance`) leaves its collection's open."""
        if not self._view:
            milvus_client.close_client(self._client)

    def __enter__(self) -> MilvusIndex:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # Writing --------------------------------------------------------------

    def _counters(self) -> tuple[int, int]:
        """`(next_id, next_seq)`, from the properties and from the rows.

        An `add` writes its rows, then the counters: a process killed in
        between leaves rows at or beyond the recorded `next_seq`. They are
        found here, once per opened index (a query for the rows past the
        counter, which scans the collection), so a reopened collection counts
        them, lists them and never reuses their ids; this process's own adds
        keep the counters current afterwards.
        """
        properties = self._properties()
        floor_id, floor_seq = self._floor or (0, 0)
        next_id = max(int(properties.get("subic.next_id", "0")), floor_id)
        next_seq = max(int(properties.get("subic.next_seq", "0")), floor_seq)
        if self._floor is not None:
            return next_id, next_seq
        while True:
            orphans = self._client.query(
                self._name,
                filter=f"seq >= {next_seq}",
                output_fields=["id", "seq"],
                limit=milvus_client.BATCH,
            )
            if not orphans:
                break
            next_seq = max(int(row["seq"]) for row in orphans) + 1
            next_id = max(next_id, max(int(row["id"]) for row in orphans) + 1)
        # Kept, as the recorded counters may stay behind until the next add.
        self._floor = next_id, next_seq
        return next_id, next_seq

    def _present(self, ids: np.ndarray) -> np.ndarray:
        """Which of `ids` the collection holds."""
        rows = get_rows(self._client, self._name, ids, [])
        return np.array([int(row["id"]) for row in rows], dtype=np.int64)

    def add(self, codes, ids=None, *, instance_codes=None) -> np.ndarray:
        """Adds codes (`check_codes` forms) with new, unique ids.

        Args:
            codes: integer codes `(n, M)` in `[0, K)`, or `(n, M*K)` vectors.
            ids: int64 ids >= 0; default: after the largest id ever added.
            instance_codes: the items' instance codes `(n, M')` (or
                `(n, M'*K')`), required by a collection made with
                `instance` and refused by one made without.

        Returns:
            The ids, int64 `(n,)`.

        Raises:
            ValueError: for bad codes, repeated ids, or ids already present
                (nothing is added).
        """
        self._check_writable()
        if self._recorded.root is not None:
            raise ValueError(
                f"collection {self._name!r} holds a folder's pictures: add them "
                "with their paths (`MilvusPictures.add`, `subic index add`)"
            )
        codes, ids = self._checked_additions(codes, ids)
        columns = milvus_schema.columns(
            codes, self._recorded, instance_codes, self._name
        )
        with self._write, milvus_errors(self._uri, self._name):
            return self._add(columns, len(codes), ids)

    def _add(
        self,
        columns: dict[str, np.ndarray],
        n: int,
        ids: np.ndarray | None,
        scalars: dict[str, list] | None = None,
    ) -> np.ndarray:
        next_id, seq = self._counters()
        if ids is None:
            ids = np.arange(next_id, next_id + n, dtype=np.int64)
        else:
            present = self._present(ids)
            if len(present):
                raise ValueError(
                    f"ids already in collection {self._name!r}: {preview(present)}; "
                    "give other ids, remove these first, or add to another "
                    "collection (the command line's --collection NAME)"
                )
        if not n:
            return ids
        scalars = scalars or {}
        inserted = 0
        try:
            for start in range(0, n, milvus_client.BATCH):
                stop = min(n, start + milvus_client.BATCH)
                rows = [
                    {
                        "id": int(ids[i]),
                        "seq": seq + i,
                        **{
                            field: dict.fromkeys(column[i].tolist(), 1.0)
                            for field, column in columns.items()
                        },
                        **{field: values[i] for field, values in scalars.items()},
                    }
                    for i in range(start, stop)
                ]
                self._client.insert(self._name, rows)
                inserted = stop
        except BaseException:
            if inserted:  # leave the collection as it was
                self._client.delete(self._name, ids=ids[:inserted].tolist())
            raise
        self._client.alter_collection_properties(
            self._name,
            properties={
                "subic.next_id": str(max(next_id, int(ids.max()) + 1)),
                "subic.next_seq": str(seq + n),
            },
        )
        return ids

    def _check_writable(self) -> None:
        if self._view:
            raise ValueError(
                "this is a view of a collection's instance codes, for searching: "
                "add and remove items through the collection itself"
            )

    def remove(self, ids) -> int:
        """Removes items by id, all or nothing.

        Raises:
            KeyError: if any id is not present (none is removed).
        """
        self._check_writable()
        ids = np.unique(check_ids("ids", ids))
        with self._write, milvus_errors(self._uri, self._name):
            present = self._present(ids)
            missing = np.setdiff1d(ids, present)
            if len(missing):
                raise KeyError(
                    f"ids not in collection {self._name!r}: {preview(missing)}"
                )
            for start in range(0, len(ids), milvus_client.BATCH):
                self._client.delete(
                    self._name, ids=ids[start : start + milvus_client.BATCH].tolist()
                )
        return len(ids)

    # Reading --------------------------------------------------------------

    def _rows(self, output_fields: list[str]) -> list[dict[str, Any]]:
        """Every row, in insertion order, read in ranges of the counter."""
        rows: list[dict[str, Any]] = []
        with milvus_errors(self._uri, self._name):
            for start in range(0, self._counters()[1], milvus_client.BATCH):
                rows += self._client.query(
                    self._name,
                    filter=f"seq >= {start} and seq < {start + milvus_client.BATCH}",
                    output_fields=["seq", *output_fields],
                )
        return sorted(rows, key=lambda row: row["seq"])

    def answer(
        self, queries, k: int, *, where=None, fingerprints=None, instance_queries=None
    ) -> list[list[dict]]:
        """`search`, each result as a row (`base.answer_rows`); with
        `instance_queries` `(nq, M'*K')` (the instance model's), by a
        collection keeping instance codes, the answer of both codes as an
        `ImageIndex` gives it (`milvus_answers`), copies marked `"copy"`."""
        scores, ids, copy = self._answered(queries, k, where, instance_queries)
        return answer_rows(self, scores, ids, None, copy)

    def _answered(self, queries, k, where, instance_queries):
        """`(scores, ids, copy)` of `answer` (`copy` None: by one code)."""
        instance = self.instance
        queries = check_queries("queries", queries, self.num_blocks, self.block_size)
        if instance_queries is None or instance is None or self._view:
            return *self.search(queries, k, where=where), None
        instance_queries = checked_instance_queries(
            instance_queries, len(queries), *instance
        )
        by_class = self.search(queries, k, where=where)
        by_instance = self.by_instance().search(instance_queries, k, where=where)
        wanted = np.unique(np.concatenate([by_class[1], by_instance[1]], axis=None))
        with milvus_errors(self._uri, self._name):
            stored = milvus_answers.read_stored(
                self._client, self._name, wanted[wanted >= 0], self._recorded
            )
        scores, ids, copy = milvus_answers.answer_both(
            queries,
            instance_queries,
            by_class,
            by_instance,
            stored,
            (self.block_size, instance[1]),
            copy_margin_of(self.instance_model),
            k,
        )
        return scores, ids, copy

    def get_ids(self) -> np.ndarray:
        """The ids, in insertion order."""
        rows = self._rows(["id"])
        return np.array([row["id"] for row in rows], dtype=np.int64)

    def get_codes(self, ids=None) -> np.ndarray:
        """Integer codes `(n, M)` of `ids` (default: all, in insertion order).

        Raises:
            KeyError: if any id is not present.
        """
        rows = self._rows(["id", self._vectors])
        codes = milvus_schema.codes_of(
            [row[self._vectors] for row in rows], self.num_blocks, self.block_size
        )
        if ids is None:
            return codes
        ids = check_ids("ids", ids)
        stored = np.array([row["id"] for row in rows], dtype=np.int64)
        order = np.argsort(stored)
        at = np.searchsorted(stored[order], ids)
        found = at < len(stored)
        found[found] = stored[order][at[found]] == ids[found]
        if not found.all():
            raise KeyError(
                f"ids not in collection {self._name!r}: {preview(ids[~found])}"
            )
        return codes[order[at]]

    def _search(
        self, queries: np.ndarray, k: int, where: filters.Filter | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`search` (at most 16,384 results, Milvus's limit): best first,
        missing results as id -1 and score -inf (module doc); a filter (on
        `id`, and on a folder's collection its pictures' fields) becomes
        Milvus's own filter expression, applied inside its search."""
        held = filter_terms.ON_PICTURES if self._recorded.root else filter_terms.ON_IDS
        expression = "" if where is None else where.milvus(held)
        width = min(k, len(self))
        scores = np.full((len(queries), width), -np.inf, dtype=np.float32)
        ids = np.full((len(queries), width), -1, dtype=np.int64)
        if not width or not len(queries):
            return scores, ids
        sparse, offsets = milvus_schema.sparse_queries(
            queries, self.num_blocks, self.block_size
        )
        asked = [i for i, entries in enumerate(sparse) if entries]
        for start in range(0, len(asked), 256):
            rows = asked[start : start + 256]
            with milvus_errors(self._uri, self._name):
                found = self._client.search(
                    self._name,
                    data=[sparse[i] for i in rows],
                    anns_field=self._vectors,
                    limit=width,
                    search_params={"metric_type": "IP"},
                    output_fields=["seq"],
                    filter=expression,
                )
            for row, hits in zip(rows, found):
                ranked = sorted(
                    hits, key=lambda h: (-h["distance"], h["entity"]["seq"])
                )
                scores[row, : len(ranked)] = [
                    h["distance"] + offsets[row] for h in ranked
                ]
                ids[row, : len(ranked)] = [h["id"] for h in ranked]
        return scores, ids
