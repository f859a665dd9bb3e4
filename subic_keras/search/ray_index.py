"""`RayIndex`: an index whose shards are `.subic` files served by Ray actors.

A collection larger than one machine is split into shards (`save_shards`),
each a `.subic` file that every node can read (a shared or replicated
folder), listed in order by a *shard manifest*, a small JSON file:

    {"format": "subic.shards", "version": 1, "num_blocks": 8,
     "block_size": 64, "shards": ["part-0.subic", "part-1.subic"]}

(paths relative to the manifest). `subic_keras.search.open("x.shards.json")`
and the command line's INDEX arguments open it as a `RayIndex`: one Ray
actor per shard loads its file and scans it with the native scan, and a
search asks every shard for its top `k` with float64 scores
(`SubicIndex.search_shard`) and merges them (`merge_results`), so results,
ties included, are those of one `SubicIndex` holding the shards' items in
manifest order.

Failures. Actors restart when their process or node dies
(`max_restarts=-1`) and calls to them are retried (`max_task_retries=-1`):
a search in flight when a shard dies waits for its restart (it reloads its
file) and answers exactly, at least once. Actors are spread over the nodes
without being pinned to one, so the shards of a lost node restart on the
others. A shard writes its file again (atomically) after every `add` and
`remove`, so a restarted shard has every change that was acknowledged;
both are idempotent, so a retried call changes nothing twice.

New items go to the last shard: as in one index, they rank after every
older item among equal scores. `remove` goes to the shards that hold the
ids.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import numpy as np

from subic_keras._io import atomic_path
from subic_keras._validation import check_int, load_json
from subic_keras.search.base import Searcher
from subic_keras.search.checks import check_ids, duplicates, preview
from subic_keras.search.sharding import merge_results
from subic_keras.search.subic_index import SubicIndex

MANIFEST_FORMAT = "subic.shards"
MANIFEST_VERSION = 1
MANIFEST_SUFFIX = ".shards.json"
_MAX_MANIFEST_BYTES = 1 << 20
_MAX_SHARDS = 4096


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A shard manifest: the block shape and the shards' absolute paths."""

    num_blocks: int
    block_size: int
    shards: tuple[str, ...]


def is_manifest(uri) -> bool:
    """Whether `uri` names a shard manifest (by its suffix)."""
    return isinstance(uri, (str, os.PathLike)) and os.fspath(uri).endswith(
        MANIFEST_SUFFIX
    )


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Reads and checks a shard manifest.

    Raises:
        ValueError: naming the path, for a file that is not a manifest, or
            shard paths outside the manifest's folder.
    """
    path = os.fspath(path)

    def fail(reason: str) -> ValueError:
        return ValueError(f"{path!r} is not a valid shard manifest: {reason}")

    with open(path, "rb") as handle:
        data = handle.read(_MAX_MANIFEST_BYTES + 1)
    if len(data) > _MAX_MANIFEST_BYTES:
        raise fail(f"larger than {_MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = load_json(data)
    except ValueError as error:
        raise fail(f"not JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise fail(f'its "format" is not {MANIFEST_FORMAT!r}')
    if manifest.get("version") != MANIFEST_VERSION:
        raise fail(f"version {manifest.get('version')!r}, this code reads 1")
    num_blocks, block_size = manifest.get("num_blocks"), manifest.get("block_size")
    if not all(isinstance(v, int) and v >= 1 for v in (num_blocks, block_size)):
        raise fail(
            f"num_blocks and block_size ({num_blocks!r}, {block_size!r}) are not "
            "positive integers"
        )
    assert isinstance(num_blocks, int) and isinstance(block_size, int)
    shards = manifest.get("shards")
    if (
        not isinstance(shards, list)
        or not 1 <= len(shards) <= _MAX_SHARDS
        or not all(isinstance(s, str) and s for s in shards)
    ):
        raise fail(f"shards must be a list of 1 to {_MAX_SHARDS} file names")
    folder = os.path.dirname(os.path.abspath(path))
    paths = []
    for shard in shards:
        full = os.path.normpath(os.path.join(folder, shard))
        if os.path.isabs(shard) or not full.startswith(folder + os.sep):
            raise fail(f"shard {shard[:200]!r} lies outside the manifest's folder")
        paths.append(full)
    if len(set(paths)) != len(paths):
        raise fail("a shard is listed twice")
    return Manifest(num_blocks, block_size, tuple(paths))


def save_shards(
    index: SubicIndex, path: str | os.PathLike, num_shards: int
) -> list[str]:
    """Splits `index` into `num_shards` files beside a manifest at `path`.

    Shard `s` is `<path without .shards.json>-<s>.subic`, a contiguous run
    of the items (`SubicIndex.shard`), so the manifest's order is the
    insertion order. Every file is written atomically, the manifest last.

    Example:

    >>> index = SubicIndex(4, 16)
    >>> ids = index.add(np.random.default_rng(0).integers(0, 16, (100, 4)))
    >>> files = save_shards(index, "codes.shards.json", 2)
    >>> [os.path.basename(f) for f in files]
    ['codes-0.subic', 'codes-1.subic']

    Returns:
        The shard files' paths.

    Raises:
        ValueError: for a path without the `.shards.json` suffix.
    """
    path = os.fspath(path)
    if not path.endswith(MANIFEST_SUFFIX):
        raise ValueError(
            f"path must end in {MANIFEST_SUFFIX!r} (a shard manifest), received "
            f"{path!r}"
        )
    num_shards = check_int("num_shards", num_shards, minimum=1)
    if num_shards > _MAX_SHARDS:
        raise ValueError(f"num_shards must be <= {_MAX_SHARDS}, received {num_shards}")
    stem = path[: -len(MANIFEST_SUFFIX)]
    files = []
    for number, shard in enumerate(index.shard(num_shards)):
        shard.model = index.model
        files.append(f"{stem}-{number}.subic")
        shard.save(files[-1])
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "num_blocks": index.num_blocks,
        "block_size": index.block_size,
        "shards": [os.path.basename(f) for f in files],
    }
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1)
    return files


class _Shard:
    """One shard in a Ray actor: its file, loaded and kept up to date."""

    def __init__(self, path: str, scanner: str):
        self.path = path
        self.index = SubicIndex.load(path, scanner=scanner)

    def info(self) -> tuple[int, int, dict | None]:
        return self.index.num_blocks, self.index.block_size, self.index.model

    def search(self, queries, k: int, where):
        return self.index.search_shard(queries, k, where=where)

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

    def codes(self, ids: np.ndarray) -> np.ndarray:
        return self.index.get_codes(ids)

    def add(self, codes: np.ndarray, ids: np.ndarray) -> None:
        present = self._present(ids)
        if present.all() and len(ids):  # a retried call: added already
            return
        self.index.add(codes[~present], ids=ids[~present])
        self.index.save(self.path)

    def remove(self, ids: np.ndarray) -> int:
        held = self.holds(ids)
        if len(held):
            self.index.remove(held)
            self.index.save(self.path)
        return len(held)


def _ray():
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            "a shard manifest is searched with Ray: pip install 'subic-keras[ray]'"
        ) from error
    return ray


class RayIndex(Searcher):
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
        ray = _ray()
        self._manifest = read_manifest(manifest)
        missing = [p for p in self._manifest.shards if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"shard files not found: {missing[:5]}")
        if not ray.is_initialized():
            ray.init(
                address=address,
                log_to_driver=False,
                include_dashboard=False,
                logging_level=logging.ERROR,  # a command's output stays its own
            )
        count = len(self._manifest.shards)
        actor = ray.remote(_Shard).options(
            max_restarts=-1,
            max_task_retries=-1,
            num_cpus=num_cpus,
            scheduling_strategy="SPREAD",
        )
        self._ray = ray
        self._actors = [actor.remote(path, scanner) for path in self._manifest.shards]
        try:
            infos = ray.get([a.info.remote() for a in self._actors], timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            for a in self._actors:
                ray.kill(a)
            raise TimeoutError(
                f"the {count} shards of {os.fspath(manifest)!r} did not all load "
                f"within {timeout:g} s (each asks for {num_cpus:g} CPUs; the "
                f"cluster has {ray.cluster_resources().get('CPU', 0):g})"
            ) from None
        for path, (m, k, _) in zip(self._manifest.shards, infos):
            if (m, k) != (self._manifest.num_blocks, self._manifest.block_size):
                raise ValueError(
                    f"shard {path!r} holds codes of {m} blocks of {k}, the manifest "
                    f"says {self._manifest.num_blocks} of {self._manifest.block_size}"
                )
        models = [info[2] for info in infos]
        self._model = models[0] if all(m == models[0] for m in models) else None
        repeated = duplicates(np.concatenate(self._all("ids")))
        if repeated.size:
            raise ValueError(f"shards share ids: {preview(repeated)}")

    def _all(self, method: str, *args) -> list:
        """`method(*args)` on every shard, in manifest order."""
        return self._ray.get([getattr(a, method).remote(*args) for a in self._actors])

    @property
    def num_blocks(self) -> int:
        return self._manifest.num_blocks

    @property
    def block_size(self) -> int:
        return self._manifest.block_size

    @property
    def model(self) -> dict | None:
        """The model that wrote the codes, if every shard records the same."""
        return self._model

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

    def _search(self, queries, k, where):
        # Each shard answers min(k, its kept items), so the merge has no
        # missing slot: min(k, kept items) columns, as one index answers.
        scores, ids = merge_results(self._all("search", queries, k, where), k)
        return scores.astype(np.float32), ids

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
        for actor, part in zip(self._actors, held):
            if len(part):
                where = np.flatnonzero(np.isin(ids, part))
                codes[where] = self._ray.get(actor.codes.remote(ids[where]))
                found[where] = True
        if not found.all():
            raise KeyError(f"ids not in the index: {preview(ids[~found])}")
        return codes

    def add(self, codes, ids=None) -> np.ndarray:
        """Adds codes to the last shard (its file is written again).

        Ids default to consecutive ones after the largest present; given
        ids must be new to every shard.

        Raises:
            ValueError: for bad codes, or ids already held by a shard.
        """
        codes, ids = self._checked_additions(codes, ids)
        every = self.get_ids()
        if ids is None:
            start = int(every.max()) + 1 if len(every) else 0
            ids = np.arange(start, start + len(codes), dtype=np.int64)
        else:
            clash = ids[np.isin(ids, every)]
            if clash.size:
                raise ValueError(f"ids already in the index: {preview(clash)}")
        self._ray.get(self._actors[-1].add.remote(codes, ids))
        return ids

    def remove(self, ids) -> int:
        """Removes items by id from the shards that hold them; all or
        nothing.

        Raises:
            KeyError: if an id is held by no shard (none is removed).
        """
        ids = np.unique(check_ids("ids", ids))
        held = np.concatenate(self._all("holds", ids)) if len(ids) else ids
        if len(held) != len(ids):
            missing = ids[~np.isin(ids, held)]
            raise KeyError(f"ids not in the index: {preview(missing)}")
        return int(sum(self._all("remove", ids)))
