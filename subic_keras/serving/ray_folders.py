"""Encoding a folder on a Ray cluster into picture shards and a manifest.

`index_folder_on_ray` is `retrieval.index_folder` for a collection larger
than one machine: the folder's files (found and ordered as `index_folder`
finds them) are split into contiguous runs, one per shard; Ray Data
decodes and encodes each run with a pool of encoder actors (each loads the
model once), and the driver writes each shard as a picture index
(`ImageIndex`, the format `subic index build` writes) beside a shard
manifest (`search.ray_index`), which `search.open`, `RayIndex` and the
command line's INDEX arguments open. A picture's code is the one
`index_folder` gives it, and its id is its place in the folder's file
list, so shards need not wait for one another. With `instance_model`,
every shard keeps an instance code of each picture beside its class code
(`search.instance_codes`), as `index_folder` does with `instance`.

Copy rules. A build of instance codes chooses its copy rules on the whole
folder once every shard is written, as `subic index build` does for one
index (`retrieval.folder_copy_rules`: altered copies of a sample of its
own pictures, no labels), and records the same rules in every shard before
the manifest names them, so each shard marks copies and lists duplicates
by the folder's rules. The driver reads every shard's instance codes for
it (`num_blocks` int32 a picture) and decodes at most
`folder_rules.FOLDER_SAMPLE` pictures.

Resuming. A shard's file is written (atomically) only once its whole run
is encoded, and a progress file beside the manifest
(`<stem>.progress.json`) records each finished shard: the model's digest,
the folder and a digest of the run's paths. Run again after an
interruption, the build encodes only the shards not finished with the same
model, folder and files; the progress file is removed once the manifest is
written. Encoders are not restarted: one lost (a node gone) fails the
build, which, run again, resumes.

Resources. Decoding happens in the encoder actors themselves (the dataset
holds only paths), so no reading task waits for a CPU the encoders hold;
each encoder asks for one CPU and the pool leaves one of the cluster's
CPUs free for Ray Data's own tasks. On one machine, `index_folder` in one
process stays the faster road (`benchmarks/ray_search.py` measures both).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import warnings

import numpy as np

from subic_keras._io import atomic_path, output_target
from subic_keras._validation import check_int, load_json
from subic_keras.data import images as image_files
from subic_keras.data.paths import find_files, read_bytes
from subic_keras.instance.instance_code import InstanceSubic
from subic_keras.models.subic import Subic
from subic_keras.pretrained import INSTANCE
from subic_keras.search import file_format
from subic_keras.search.image_index import ImageIndex
from subic_keras.search.manifests import (
    MANIFEST_SUFFIX,
    MAX_SHARDS,
    is_new_build,
    new_build,
    shard_paths,
    write_manifest,
)
from subic_keras.search.ray_cluster import ray_module
from subic_keras.serving.retrieval import (
    FolderReport,
    folder_copy_rules,
    input_shape,
    model_record,
)

PROGRESS_FORMAT = "subic.shards.progress"
_MAX_PROGRESS_BYTES = 64 << 20


class _Encoder:
    """A Ray Data actor: the model, loaded once; decodes and encodes
    batches of `{"id", "path"}` rows."""

    def __init__(self, model_path: str, root: str, instance_model: str | None = None):
        from subic_keras.serving.export import load_encoder

        self.subic = load_encoder(model_path)
        self.subic.show_progress = False
        self.instance: InstanceSubic | None = None
        if instance_model is not None:  # checked by the driver to be one
            instance = load_encoder(instance_model)
            assert isinstance(instance, InstanceSubic)
            self.instance = instance
        self.root = root
        self.shape = input_shape(self.subic)

    def __call__(self, batch: dict) -> dict:
        paths = [str(p) for p in batch["path"]]
        ids = np.asarray(batch["id"], np.int64)
        (decoded,) = image_files.image_batches(
            self.root, paths, self.shape, max(1, len(paths))
        )
        row = {path: i for i, path in enumerate(paths)}
        kept = np.array([row[p] for p in decoded.paths], np.int64)
        codes = np.zeros((len(paths), self.subic.num_blocks), np.int32)
        fingerprints = np.zeros(len(paths), np.uint64)
        width = 0 if self.instance is None else self.instance.num_blocks
        instance_codes = np.zeros((len(paths), width), np.int32)
        if len(kept):
            codes[kept] = self.subic.encode(decoded.pixels, batch_size=len(kept))
            if self.instance is not None:
                own = self.instance.own_pictures(decoded.pixels)
                instance_codes[kept] = self.instance.encode(own, batch_size=len(kept))
            fingerprints[kept] = decoded.fingerprints
        reasons = np.full(len(paths), "", object)
        for skipped in decoded.skipped:
            reasons[row[skipped.path]] = skipped.reason
        return {
            "id": ids,
            "path": np.array(paths, object),
            "code": codes,
            "instance_code": instance_codes,
            "fingerprint": fingerprints,
            "reason": reasons,
        }


def _paths_digest(paths: list[str]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.encode() + b"\0")
    return digest.hexdigest()


def _progress_path(manifest: str) -> str:
    return manifest[: -len(MANIFEST_SUFFIX)] + ".progress.json"


def _read_progress(path: str, model: str, root: str) -> tuple[str | None, dict]:
    """The build token and the shards a build finished with this model and
    folder (`(None, {})` when there is no progress file, or one of another
    build)."""
    try:
        progress = load_json(read_bytes(path, _MAX_PROGRESS_BYTES, "progress file"))
    except (OSError, ValueError):
        return None, {}  # (a FIFO is refused at once: `read_bytes`)
    if (
        not isinstance(progress, dict)
        or progress.get("format") != PROGRESS_FORMAT
        or progress.get("model") != model
        or progress.get("root") != root
        or not is_new_build(progress.get("build"))
        or not isinstance(progress.get("shards"), dict)
    ):
        return None, {}
    return progress["build"], progress["shards"]


def _write_progress(path: str, model: str, root: str, build: str, shards: dict) -> None:
    progress = {"format": PROGRESS_FORMAT, "model": model, "root": root}
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        json.dump({**progress, "build": build, "shards": shards}, handle)


def index_folder_on_ray(
    model_path: str | os.PathLike,
    root: str | os.PathLike,
    manifest: str | os.PathLike,
    num_shards: int,
    *,
    address: str | None = None,
    batch_size: int = 256,
    encoders: int | None = None,
    instance_model: str | None = None,
) -> tuple[list[str], FolderReport]:
    """Encodes every picture under `root` on Ray into `num_shards` shards.

    Example:

    >>> files, report = index_folder_on_ray(
    ...     "best.keras", "photos/", "photos.shards.json", 4)
    >>> sharded = subic_keras.search.open("photos.shards.json")

    Args:
        model_path: the SuBiC `.keras` model; every node must be able to
            read it (and the folder) at the same path.
        root: the folder of pictures.
        manifest: the shard manifest to write (`*.shards.json`); shard `s`
            is `<stem>-<build>-<s>.subic` beside it, the files of this build
            (`search.manifests`: a reader of the manifest keeps working
            across one rebuild).
        num_shards: shards, >= 1 (a contiguous run of the files each).
        address: the Ray cluster to join when Ray is not initialized yet
            (`None`: `RAY_ADDRESS`, or a local one).
        batch_size: pictures an encoder decodes and encodes at a time.
        encoders: encoder actors (each asks for one CPU); default: the
            cluster's CPUs but one, at least one.
        instance_model: an instance code (`"instance"`, the one that ships,
            or a `.keras` file every node reads at the same path) whose codes
            each shard keeps beside a class model's; default: none.

    Returns:
        `(files, report)`: the shards' paths, and the counts of pictures
        added (encoded now), already indexed (shards finished by an
        interrupted build) and skipped, with each skipped file's reason
        (in path order, however the shards finished), and the copy rules
        chosen on the folder and recorded in every shard (`copy_rules`,
        as `retrieval.choose_copy_rules` returns them; None for class codes
        alone).

    Raises:
        ValueError: for a manifest path without the `.shards.json` suffix,
            or bad counts.
        ImportError: without Ray.
        NotADirectoryError, FileNotFoundError: `root` is not a folder.
    """
    manifest, num_shards, batch_size = _checked(manifest, num_shards, batch_size)
    progress_file = _progress_path(manifest)
    root = os.path.realpath(root)
    paths, skipped = find_files(root)
    models = _Models.load(model_path, instance_model)
    subic, instance, record = models.subic, models.instance, models.record
    shape = input_shape(subic)
    ray = ray_module(address)
    encoders = _encoder_count(ray, encoders)
    build, finished = _read_progress(progress_file, models.digests, root)
    # A build resumed by its progress file goes on writing its own files.
    build = build or new_build(manifest)
    report = FolderReport(skipped=list(skipped))
    bounds = np.linspace(0, len(paths), num_shards + 1).astype(np.int64)
    files = shard_paths(manifest, num_shards, build)
    runs = _runs_to_encode(paths, bounds, finished, files, build, report)

    def write(number: int, column: dict[str, np.ndarray] | None) -> None:
        both = None if instance is None else (instance.num_blocks, instance.block_size)
        index = ImageIndex(
            subic.num_blocks, subic.block_size, root, shape, instance=both
        )
        index.model, index.shard_label = record, (build, number)
        if index.instance is not None:
            index.instance.model = models.instance_record
        passed = [] if column is None else _add_run(index, column)
        index.save(files[number])
        report.added += len(index)
        report.skipped += passed
        finished[str(number)] = {
            "paths": _paths_digest(runs[number]),
            "added": len(index),
            "skipped": [dataclasses.asdict(entry) for entry in passed],
        }
        _write_progress(progress_file, models.digests, root, build, finished)

    for number in [n for n, run in runs.items() if not run]:
        write(number, None)
    rows = [
        {"id": int(bounds[number]) + i, "path": path}
        for number, run in runs.items()
        for i, path in enumerate(run)
    ]
    if rows:
        arguments = (models.model_path, root, models.instance_model)
        _encode(ray, rows, arguments, batch_size, encoders, bounds, runs, write)
    code = instance or (subic if isinstance(subic, InstanceSubic) else None)
    if code is not None:
        report.copy_rules = _record_copy_rules(
            files, code, code is not subic, root, shape, batch_size
        )
    write_manifest(
        manifest,
        subic.num_blocks,
        subic.block_size,
        files,
        build,
        record["digest"],
        labelled=True,
    )
    if os.path.exists(progress_file):
        os.remove(progress_file)
    # Shards finish in any order: the files passed over are listed in the
    # folder's, whichever shard met them and whether it was resumed.
    report.skipped.sort(key=lambda entry: entry.path)
    return files, report


def _checked(
    manifest: str | os.PathLike, num_shards: int, batch_size: int
) -> tuple[str, int, int]:
    """The manifest's path and the counts, checked before Ray starts.

    A link or a FIFO at the manifest or its progress file is refused now,
    not after every picture was encoded.
    """
    manifest = os.fspath(manifest)
    if not manifest.endswith(MANIFEST_SUFFIX):
        raise ValueError(
            f"manifest must end in {MANIFEST_SUFFIX!r}, received {manifest!r}"
        )
    num_shards = check_int("num_shards", num_shards, minimum=1)
    if num_shards > MAX_SHARDS:
        raise ValueError(f"num_shards must be <= {MAX_SHARDS}, received {num_shards}")
    batch_size = check_int("batch_size", batch_size, minimum=1)
    for output in (manifest, _progress_path(manifest)):
        output_target(output)
    return manifest, num_shards, batch_size


@dataclasses.dataclass
class _Models:
    """The class model (or instance code) of a build and the instance code
    kept beside it, loaded, with what the shards record of them."""

    model_path: str
    subic: Subic | InstanceSubic
    record: dict
    instance_model: str | None = None
    instance: InstanceSubic | None = None
    instance_record: dict | None = None

    @classmethod
    def load(cls, model_path, instance_model: str | None) -> _Models:
        from subic_keras.serving.export import load_encoder

        model_path = os.fspath(model_path)
        if model_path != INSTANCE:  # the shipped code, by its name
            model_path = os.path.abspath(model_path)
        subic = load_encoder(model_path)
        models = cls(model_path, subic, model_record(subic, model_path))
        if instance_model is not None and not isinstance(subic, InstanceSubic):
            if instance_model != INSTANCE:
                instance_model = os.path.abspath(instance_model)
            instance = load_encoder(instance_model)
            if not isinstance(instance, InstanceSubic):
                raise ValueError(
                    f"instance_model must be an instance code, received the "
                    f"class model {instance_model}"
                )
            models.instance_model, models.instance = instance_model, instance
            models.instance_record = model_record(instance, instance_model)
        return models

    @property
    def digests(self) -> str:
        """What a build is resumed by: only one of the same model(s)."""
        return self.record["digest"] + (self.instance_record or {}).get("digest", "")


def _runs_to_encode(paths, bounds, finished, files, build, report) -> dict:
    """`{shard: its run of paths}` of the shards to encode now; those an
    interrupted build finished are counted in `report` instead."""
    runs = {}
    for number, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        done = finished.get(str(number))
        reused = _finished_shard(done, paths[lo:hi], files[number], (build, number))
        if reused is None:
            runs[number] = paths[lo:hi]
        else:
            report.already_indexed += reused[0]
            report.skipped += reused[1]
    return runs


def _encoder_count(ray, encoders: int | None) -> int:
    cpus = int(ray.cluster_resources().get("CPU", 0))
    if encoders is None:
        encoders = max(1, cpus - 1)
    encoders = check_int("encoders", encoders, minimum=1)
    if encoders > cpus:
        # Each encoder asks for a CPU: more than the cluster has would wait
        # for ever.
        raise ValueError(
            f"encoders must be at most the Ray cluster's CPUs ({cpus}), received "
            f"{encoders}"
        )
    return encoders


def _encode(ray, rows, arguments, batch_size, encoders, bounds, runs, write) -> None:
    """Encodes `rows` (`{"id", "path"}`) with a pool of `encoders` actors
    (`_Encoder(*arguments)`), and `write`s each shard of `runs` once every
    row of its run has come (batches come in any order)."""
    # Ray Data hands each map worker arguments in the object store
    # (ray-project/ray#57733), from which Ray cannot restart an actor
    # reliably (#53727) and which it reports at error level where restarts
    # are asked for. A lost encoder fails the build instead; run again, it
    # resumes from its finished shards. `max_restarts=0` is Ray Data's own
    # way (its deprecation names no other yet).
    from ray.util.annotations import RayDeprecationWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RayDeprecationWarning)
        encoded = ray.data.from_items(rows).map_batches(
            _Encoder,
            fn_constructor_args=arguments,
            batch_size=batch_size,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=encoders),
            num_cpus=1,
            max_restarts=0,
        )
    parts: dict[int, list[dict]] = {number: [] for number in runs}
    missing = {number: len(run) for number, run in runs.items()}
    for batch in encoded.iter_batches(batch_size=None, batch_format="numpy"):
        shard_of = np.searchsorted(bounds, batch["id"], side="right") - 1
        for number in np.unique(shard_of):
            mine = shard_of == number
            parts[number].append({k: v[mine] for k, v in batch.items()})
            missing[number] -= int(np.count_nonzero(mine))
            if not missing[number]:
                pieces = parts.pop(number)
                write(
                    number, {k: np.concatenate([p[k] for p in pieces]) for k in batch}
                )


def _record_copy_rules(files, code: InstanceSubic, beside, root, shape, batch_size):
    """Chooses the copy rules on every shard's pictures as one folder (in
    manifest order: the order one index lists them) and rewrites each shard
    with them (atomically, before the manifest names it); returns them, or
    None for a folder of no picture. Shards are loaded one at a time, so the
    driver holds the folder's instance codes and one shard, never all."""
    paths: list[str] = []
    codes, fingerprints = [], []
    for file in files:
        more_paths, more_codes, more_fingerprints = ImageIndex.load(file).copy_items()
        paths += more_paths
        codes.append(more_codes)
        fingerprints.append(more_fingerprints)
    if not paths:
        return None
    rules = folder_copy_rules(
        code, root, shape, paths, np.concatenate(codes),
        np.concatenate(fingerprints), beside=beside, batch_size=batch_size,
    )  # fmt: skip
    for file in files:
        shard = ImageIndex.load(file)
        shard.record_copy_rules(rules)
        shard.save(file)
    return rules


def _finished_shard(done, run: list[str], file: str, label: tuple[str, int]):
    """`(added, skipped files)` of a shard a progress file records as
    finished for the same run of files, whose file is there and is that
    shard (`label`, as `SubicIndex.shard_label`); else None."""
    if (
        not isinstance(done, dict)
        or done.get("paths") != _paths_digest(run)
        or not isinstance(done.get("added"), int)
        or not isinstance(done.get("skipped"), list)
        or (file_format.recorded_metadata(file) or {}).get("shard") != list(label)
    ):
        return None
    skipped = []
    for entry in done["skipped"]:
        if not isinstance(entry, dict) or not all(
            isinstance(entry.get(key), str) for key in ("path", "reason")
        ):
            return None
        skipped.append(image_files.SkippedFile(entry["path"], entry["reason"]))
    return done["added"], skipped


def _add_run(index: ImageIndex, column: dict[str, np.ndarray]):
    """Adds a run's decoded pictures (encoder output columns) to `index` in
    the run's order; returns the files skipped."""
    order = np.argsort(column["id"], kind="stable")
    failed = column["reason"][order] != ""
    kept = order[~failed]
    if len(kept):
        index.add(
            column["code"][kept],
            [str(path) for path in column["path"][kept]],
            column["fingerprint"][kept],
            ids=column["id"][kept],
            instance_codes=None
            if index.instance is None
            else column["instance_code"][kept],
        )
    return [
        image_files.SkippedFile(str(column["path"][i]), str(column["reason"][i]))
        for i in order[failed]
    ]
