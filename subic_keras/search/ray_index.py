"""`RayIndex`: an index whose shards are index files served by Ray actors.

A collection larger than one machine is split into shards, each a `.subic`
file that every node can read (a shared or replicated folder), listed by a
shard manifest (`manifests`: `save_shards`, `read_manifest`).
`subic_keras.search.open("x.shards.json")` and the command line's INDEX
arguments open it as a `RayIndex`: one Ray actor per shard loads its file
and scans it with the native scan. The shards are all indexes of codes
(`SubicIndex`) or all picture indexes of one folder (`ImageIndex`,
`ray_folders` builds them); of pictures, a `RayIndex` answers with paths
and is served by `subic serve` as one picture index is.

Results are those of one index holding the shards' items in manifest
order, ties included: every shard sends its best by the codes with
float64 scores (`search_shard`), merged by score, then manifest and
insertion order (`sharding.merge_results`). Of pictures with instance
codes (`instance_codes`), each shard sends its part of the answer of both
codes (`shard_both`), merged as one index's (`merge_parts`), and
`by_instance()` searches the shards by their instance codes alone. Of
pictures, the exact copies of a query come first, from every shard in
manifest order.

Failures. Actors restart when their process or node dies
(`max_restarts=-1`) and calls to them are retried (`max_task_retries=-1`):
a search in flight when a shard dies waits for its restart (it reloads its
file) and answers exactly, at least once. Actors are spread over the nodes
without being pinned to one, so the shards of a lost node restart on the
others. A shard writes its file again (atomically) after every `add` and
`remove`, so a restarted shard has every change that was acknowledged;
both are idempotent, so a retried call changes nothing twice. A shard that
cannot restart (its file removed by a second rebuild, or replaced by codes
of another model: `manifests`) fails every call with `ShardUnavailableError`
naming it and why; the index is then `degraded` until opened again.

New codes go to the last shard (of codes): as in one index, they rank
after every older item among equal scores. `remove` goes to the shards
that hold the ids.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import numpy as np

from subic_keras.search import filters
from subic_keras.search.base import PictureIndex, answer_rows
from subic_keras.search.checks import (
    check_fingerprints,
    check_ids,
    check_queries,
    duplicates,
    preview,
)
from subic_keras.search.copy_rules import duplicate_groups, recorded_copy_blocks
from subic_keras.search.image_index import ImageIndex, read_file
from subic_keras.search.instance_codes import merge_parts
from subic_keras.search.manifests import (
    Manifest,
    check_label,
    check_shard_files,
    read_manifest,
)
from subic_keras.search.ray_cluster import ray_module
from subic_keras.search.sharding import merge_results
from subic_keras.search.views import exact_first


class ShardUnavailableError(OSError):
    """A shard's actor cannot answer: its file is gone or no longer the one
    the index opened (`manifests`). The index must be opened again."""


class _Shard:
    """One shard in a Ray actor: its file (codes, or pictures), loaded and
    kept up to date."""

    def __init__(self, path: str, scanner: str, manifest: Manifest):
        self.path = path
        number = manifest.shards.index(path)
        # A SubicIndex or an ImageIndex: the methods called are on both,
        # or called on pictures only. Read inside the manifest's folder
        # only, as `check_shard_files` checked it.
        self.index: Any = read_file(path, scanner=scanner, folder=manifest.folder)
        self.pictures = isinstance(self.index, ImageIndex)
        # Run again on every restart: a file replaced since the index was
        # opened by codes of another model is refused, never served.
        found = _digest(self.index.model)
        if manifest.records_model and found != manifest.model:

            def named(digest: str | None) -> str:
                return "no recorded model" if digest is None else f"model {digest}"

            raise ValueError(
                f"its codes are of {named(found)}, its manifest's build "
                f"{manifest.build} of {named(manifest.model)}: the file was "
                "replaced; build the index again"
            )
        check_label(manifest, number, self.index.shard_label)

    def info(self) -> dict:
        index = self.index
        return {
            "blocks": (index.num_blocks, index.block_size),
            "model": index.model,
            "root": index.root if self.pictures else None,
            "image_shape": index.image_shape if self.pictures else None,
            "looks": index.written_with_looks,
            "instance_model": index.instance_model if self.pictures else None,
            "instance_blocks": self._instance_blocks(),
        }

    def _instance_blocks(self) -> tuple[int, int] | None:
        instance = self.index.instance if self.pictures else None
        return None if instance is None else (instance.num_blocks, instance.block_size)

    def _searched(self, instance: bool) -> Any:
        """The shard's index, or the view of its instance codes."""
        return self.index.by_instance() if instance else self.index

    def candidates(self, queries, k: int, where, instance: bool = False) -> tuple:
        return self._searched(instance).search_shard(queries, k, where=where)

    def both(self, queries, instance_queries, k: int, where) -> dict:
        return self.index.shard_both(queries, instance_queries, k, where=where)

    def copies(self, fingerprints, k: int, where, instance: bool = False) -> list:
        return self._searched(instance).shard_copies(fingerprints, k, where=where)

    def describe(self, ids: np.ndarray) -> list[dict]:
        """What the shard knows of the ids of `ids` it holds."""
        return self.index.describe(self.holds(ids))

    def folders(self) -> list[str]:
        return self.index.folders() if self.pictures else []

    def size(self) -> int:
        return len(self.index)

    def node_id(self) -> str:
        """The Ray node the shard runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def ids(self) -> np.ndarray:
        return self.index.get_ids()

    def holds(self, ids: np.ndarray) -> np.ndarray:
        """The ids of `ids` this shard holds."""
        return ids[self._present(ids)]

    def _present(self, ids: np.ndarray) -> np.ndarray:
        return np.isin(ids, self.index.get_ids())

    def codes(self, ids: np.ndarray, instance: bool = False) -> np.ndarray:
        return self._searched(instance).get_codes(ids)

    def add(self, codes: np.ndarray, ids: np.ndarray) -> None:
        present = self._present(ids)
        if present.all() and len(ids):  # a retried call: added already
            return
        self.index.add(codes[~present], ids=ids[~present])
        self.index.save(self.path)

    def remove(self, ids: np.ndarray) -> int:
        held = self.holds(ids)
        if len(held):
            self.index.remove(self.index.paths(held) if self.pictures else held)
            self.index.save(self.path)
        return len(held)


def _digest(model: dict | None) -> str | None:
    return None if model is None else model.get("digest")


def _one_model(shards: tuple[str, ...], models: list) -> dict | None:
    """The model record every shard holds, or the error naming the first
    shard whose codes another model (or no recorded model) wrote."""

    def named(model) -> str:
        if model is None:
            return "no recorded model"
        return f"{model.get('path') or model.get('file')} (digest {_digest(model)})"

    for path, model in zip(shards, models):
        if _digest(model) != _digest(models[0]):
            raise ValueError(
                f"shard {path!r} holds codes of {named(model)}, the first shard "
                f"{shards[0]!r} codes of {named(models[0])}: a manifest lists "
                "shards of one model"
            )
    return models[0]


def _failure(ray, shards: tuple[str, ...], refs: list) -> tuple[str, str] | None:
    """The first shard whose call failed (of calls already ended), and why
    in one line (not Ray's traceback of the actor)."""
    for path, ref in zip(shards, refs):
        try:
            ray.get(ref, timeout=0)
        except ray.exceptions.GetTimeoutError:
            continue  # still running (a subclass of RayError)
        except ray.exceptions.RayError as error:
            cause = getattr(error, "cause", None) or error
            lines = [line for line in str(cause).splitlines() if line.strip()]
            # Ray's text of a failed task ends with the exception's own line.
            reason = lines[-1].strip() if lines else type(cause).__name__
            return path, reason[:500]
    return None


class RayIndex(PictureIndex):
    """The shards of a manifest, each in a Ray actor, searched as one index.

    Example:

    >>> index = SubicIndex(4, 16)
    >>> ids = index.add(np.random.default_rng(0).integers(0, 16, (1000, 4)))
    >>> _ = save_shards(index, "codes.shards.json", 4)
    >>> sharded = RayIndex("codes.shards.json")     # ray.init() if not yet
    >>> z_star = np.random.default_rng(1).random((2, 64), dtype=np.float32)
    >>> [np.array_equal(a, b) for a, b in zip(sharded.search(z_star, 10),
    ...                                       index.search(z_star, 10))]
    [True, True]

    Args:
        manifest: a shard manifest (`save_shards`).
        address: the Ray cluster to join (`ray.init(address=...)`) when
            Ray is not initialized yet; `None` starts or finds a local one
            (`RAY_ADDRESS`).
        scanner: the shards' scanner (`SubicIndex`'s argument).
        num_cpus: CPUs each shard's actor reserves (Ray's `num_cpus`). The
            default, 0, reserves none: shards are spread over the nodes and
            scan with their nodes' cores, and the shards of a lost node
            always fit on the others.
        timeout: seconds to wait for every shard to load.

    Raises:
        ImportError: without Ray.
        ValueError: for a bad manifest, or shards whose block shape differs
            from the manifest's or that share ids.
    """

    def __init__(
        self,
        manifest: str | os.PathLike,
        *,
        address: str | None = None,
        scanner: str = "auto",
        num_cpus: float = 0,
        timeout: float = 300.0,
    ):
        self._manifest = read_manifest(manifest)
        self._blocks = (self._manifest.num_blocks, self._manifest.block_size)
        check_shard_files(self._manifest, manifest)
        ray = ray_module(address)
        count = len(self._manifest.shards)
        actor = ray.remote(_Shard).options(
            max_restarts=-1,
            max_task_retries=-1,
            num_cpus=num_cpus,
            scheduling_strategy="SPREAD",
        )
        self._ray = ray
        self._unavailable: dict[str, str] = {}
        self._actors = [
            actor.remote(path, scanner, self._manifest)
            for path in self._manifest.shards
        ]
        loaded = [a.info.remote() for a in self._actors]
        try:
            infos = ray.get(loaded, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            self._stop()
            raise TimeoutError(
                f"the {count} shards of {os.fspath(manifest)!r} did not all load "
                f"within {timeout:g} s (each asks for {num_cpus:g} CPUs; the "
                f"cluster has {ray.cluster_resources().get('CPU', 0):g})"
            ) from None
        except ray.exceptions.RayError:
            # Asked before the actors stop: stopping cancels the loads
            # still running, which would then fail too.
            path, reason = _failure(ray, self._manifest.shards, loaded) or (
                "?",
                "its actor failed while loading",
            )
            self._stop()
            raise ValueError(f"shard {path!r} cannot be loaded: {reason}") from None
        for path, info in zip(self._manifest.shards, infos):
            if tuple(info["blocks"]) != (self.num_blocks, self.block_size):
                m, k = info["blocks"]
                raise ValueError(
                    f"shard {path!r} holds codes of {m} blocks of {k}, the manifest "
                    f"says {self.num_blocks} of {self.block_size}"
                )
        for field in ("root", "image_shape"):
            if len({repr(info[field]) for info in infos}) > 1:
                raise ValueError(
                    f"the shards of {os.fspath(manifest)!r} differ in {field} "
                    f"({', '.join(sorted({repr(i[field]) for i in infos}))[:300]}): "
                    "a manifest lists shards of one folder's pictures, or of codes"
                )
        self._root, self._image_shape = infos[0]["root"], infos[0]["image_shape"]
        self._model = _one_model(self._manifest.shards, [i["model"] for i in infos])
        self._instance_model = _one_model(
            self._manifest.shards, [i["instance_model"] for i in infos]
        )
        self._looks = any(info["looks"] for info in infos)
        self._instance_view = False  # searched by the instance codes (`by_instance`)
        self._instance_blocks = infos[0]["instance_blocks"]
        repeated = duplicates(np.concatenate(self._all("ids")))
        if repeated.size:
            raise ValueError(f"shards share ids: {preview(repeated)}")

    def _stop(self) -> None:
        for actor in self._actors:
            self._ray.kill(actor)

    def _all(self, method: str, *args) -> list:
        """`method(*args)` on every shard, in manifest order."""
        return self._get([getattr(a, method).remote(*args) for a in self._actors])

    def _get(self, refs: list, shards: tuple[str, ...] | None = None) -> list:
        """The results of calls on `shards` (all, by default), or the
        `ShardUnavailableError` of the first shard that could not answer."""
        ray, shards = self._ray, shards or self._manifest.shards
        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError:
            path, reason = _failure(ray, shards, refs) or ("?", "its actor died")
        self._unavailable[path] = reason
        raise ShardUnavailableError(
            f"shard {path!r} is unavailable: {reason}; the index is degraded "
            "until it is opened again"
        )

    @property
    def unavailable(self) -> dict[str, str]:
        """The shards that could not answer since the index was opened, and
        why: the index is degraded while any is listed."""
        return dict(self._unavailable)

    @property
    def num_blocks(self) -> int:
        return self._blocks[0]

    @property
    def block_size(self) -> int:
        return self._blocks[1]

    @property
    def model(self) -> dict | None:
        """The model that wrote the codes, if every shard records the same."""
        return self._model

    @property
    def instance_model(self) -> dict | None:
        """The instance model whose codes every shard keeps beside its class
        codes (`instance_codes`), if every shard records the same."""
        return self._instance_model

    @property
    def root(self) -> str | None:
        """The folder of the shards' pictures (picture shards; else None)."""
        return self._root

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        """The pictures' decoded shape (picture shards; else None)."""
        return None if self._image_shape is None else tuple(self._image_shape)

    @property
    def written_with_looks(self) -> bool:
        """Whether a shard's file was an earlier version's, with looks
        (`ImageIndex.written_with_looks`)."""
        return self._looks

    def by_instance(self) -> RayIndex:
        """The same pictures searched by their instance codes alone (`subic
        search instance` of shards that keep both), for reading: a
        `RayIndex` of the same actors, whose `add` and `remove` raise
        (`ImageIndex.by_instance` of every shard).

        Raises:
            ValueError: the shards keep no instance codes.
        """
        record, blocks = self._instance_model, self._instance_blocks
        if record is None or blocks is None:
            raise ValueError("the shards keep no instance codes")
        view = copy.copy(self)
        view._instance_view = True
        view._blocks, view._instance_blocks = tuple(blocks), None
        view._model, view._instance_model = record, None
        shape = record.get("input_shape")
        view._image_shape = shape if isinstance(shape, list) else None
        return view

    @property
    def actors(self) -> list:
        """The shards' Ray actor handles, in manifest order."""
        return list(self._actors)

    def __len__(self) -> int:
        return int(sum(self._all("size")))

    def __repr__(self) -> str:
        return (
            f"RayIndex(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"shards={len(self._actors)})"
        )

    # Searching ----------------------------------------------------------

    def search(
        self, queries, k: int, *, where=None, fingerprints=None, **more
    ) -> tuple[np.ndarray, np.ndarray]:
        """The search of one index holding the shards' items in manifest
        order (`SubicIndex.search`; of picture shards, `ImageIndex.search`
        with its `fingerprints` and `instance_queries`): the same results,
        ties included."""
        scores, ids, *_ = self._ranked(queries, k, where, fingerprints, **more)
        return scores, ids

    def answer(
        self, queries, k: int, *, where=None, fingerprints=None, **more
    ) -> list[list[dict]]:
        scores, ids, exact, copy = self._ranked(queries, k, where, fingerprints, **more)
        return answer_rows(self, scores, ids, exact, copy)

    def _search(self, queries, k, where):
        scores, ids, *_ = self._ranked(queries, k, where, None)
        return scores, ids

    def _ranked(self, queries, k, where, fingerprints, instance_queries=None):
        """`(scores, ids, exact, copy)`: each shard's best, merged by score
        and then position in manifest order (float64, so that no two sums
        collapse into one), or with `instance_queries` the answer of both
        codes (`instance_codes.merge_parts`; `copy` None without), exact
        copies first."""
        k = self._check_k(k)
        queries = check_queries("queries", queries, self.num_blocks, self.block_size)
        where = filters.as_filter(where)
        if instance_queries is not None and self._instance_model is not None:
            parts = self._all("both", queries, instance_queries, k, where)
            scores, ids, copy = merge_parts(parts, k)
            exact = self._exact_first(scores, ids, queries, fingerprints, where, copy)
            return scores, ids, exact, copy
        parts = self._all("candidates", queries, k, where, self._instance_view)
        scores, ids = merge_results(parts, k)
        scores = scores.astype(np.float32)
        exact = self._exact_first(scores, ids, queries, fingerprints, where)
        return scores, ids, exact, None

    def _exact_first(
        self, scores, ids, queries, fingerprints, where, copy=None
    ) -> np.ndarray:
        """`views.exact_first` of the copies by fingerprint that the shards
        hold (their `copy` flags following them); which results they are."""
        if fingerprints is None or self._root is None or not ids.shape[1]:
            return np.zeros(ids.shape, bool)
        fingerprints = check_fingerprints(fingerprints, len(ids))
        copies = self._all(
            "copies", fingerprints, ids.shape[1], where, self._instance_view
        )
        # Shards in manifest order hold the copies in insertion order.
        found = [
            [np.concatenate([shard[row][part] for shard in copies]) for part in (1, 2)]
            for row in range(len(ids))
        ]
        return exact_first(scores, ids, queries, found, copy)

    # Items --------------------------------------------------------------

    def describe(self, ids) -> list[dict]:
        """Each item's fields (`ImageIndex.describe` of picture shards).

        Raises:
            KeyError: for an id no shard holds.
        """
        ids = check_ids("ids", ids)
        rows = {row["id"]: row for part in self._all("describe", ids) for row in part}
        missing = [int(i) for i in ids if int(i) not in rows]
        if missing:
            raise KeyError(f"ids not in the index: {preview(np.array(missing))}")
        return [rows[int(i)] for i in ids]

    def paths(self, ids) -> list[str]:
        """The relative paths of `ids` (picture shards), in order.

        Raises:
            KeyError: for an id no shard holds.
        """
        return [row["path"] for row in self.describe(ids)]

    def folders(self) -> list[str]:
        """The folders that hold pictures, sorted (`ImageIndex.folders`)."""
        return sorted(set().union(*self._all("folders")))

    def duplicates(self, copy_blocks: int | None = None) -> list[list[str]]:
        """`ImageIndex.duplicates` of the shards as one index: every
        picture's instance code searched among all shards' (each shard
        scans its own, in parallel), the pairs joined here.

        Raises:
            ValueError: shards of codes alone (no pictures), or no
                `copy_blocks` given or recorded.
        """
        if not self.holds_pictures:
            raise ValueError(
                "duplicates lists pictures, and these shards hold codes alone"
            )
        part = self if self._instance_model is None else self.by_instance()
        copy_blocks = recorded_copy_blocks(part.model, copy_blocks, part.num_blocks)
        ids = part.get_ids()
        codes = part.get_codes(ids)
        groups = duplicate_groups(codes, ids, part.block_size, copy_blocks, index=part)
        return [self.paths(group) for group in groups]

    def get_ids(self) -> np.ndarray:
        """Every id, in manifest order, then insertion order."""
        return np.concatenate(self._all("ids"))

    def get_codes(self, ids) -> np.ndarray:
        """The codes `(n, M)` of `ids`, in order.

        Raises:
            KeyError: for an id no shard holds.
        """
        ids = check_ids("ids", ids)
        held = self._all("holds", ids)
        codes = np.zeros((len(ids), self.num_blocks), np.int64)
        found = np.zeros(len(ids), bool)
        for actor, path, part in zip(self._actors, self._manifest.shards, held):
            if len(part):
                where = np.flatnonzero(np.isin(ids, part))
                asked = actor.codes.remote(ids[where], self._instance_view)
                codes[where] = self._get([asked], (path,))[0]
                found[where] = True
        if not found.all():
            raise KeyError(f"ids not in the index: {preview(ids[~found])}")
        return codes

    def add(self, codes, ids=None) -> np.ndarray:
        """Adds codes to the last shard (its file is written again).

        Ids default to consecutive ones after the largest present; given
        ids must be new to every shard.

        Raises:
            ValueError: for bad codes, ids already held by a shard, or
                shards of pictures (whose files have paths: build them
                again from their folder, `subic index build`).
        """
        if self._root is not None:
            raise ValueError(
                "the shards hold pictures of a folder, added to by building them "
                "again: subic index build MODEL FOLDER --output MANIFEST (only "
                "new shards' pictures are encoded after an interruption)"
            )
        codes, ids = self._checked_additions(codes, ids)
        every = self.get_ids()
        if ids is None:
            start = int(every.max()) + 1 if len(every) else 0
            ids = np.arange(start, start + len(codes), dtype=np.int64)
        else:
            clash = ids[np.isin(ids, every)]
            if clash.size:
                raise ValueError(f"ids already in the index: {preview(clash)}")
        self._get([self._actors[-1].add.remote(codes, ids)], self._manifest.shards[-1:])
        return ids

    def remove(self, ids) -> int:
        """Removes items by id from the shards that hold them; all or
        nothing.

        Raises:
            KeyError: if an id is held by no shard (none is removed).
            ValueError: for the view of the instance codes (`by_instance`).
        """
        if self._instance_view:
            raise ValueError(
                "the view of the shards' instance codes is for reading: remove "
                "pictures from the index itself"
            )
        ids = np.unique(check_ids("ids", ids))
        held = np.concatenate(self._all("holds", ids)) if len(ids) else ids
        if len(held) != len(ids):
            missing = ids[~np.isin(ids, held)]
            raise KeyError(f"ids not in the index: {preview(missing)}")
        return int(sum(self._all("remove", ids)))
