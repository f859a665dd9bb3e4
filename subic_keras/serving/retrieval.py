"""Retrieval with a trained SuBiC model: index, search and score a protocol.

The glue behind `subic index build`, `subic search`, `subic evaluate` and
`subic quickstart`. Scoring goes through `subic_keras.evaluation.scoring`, the same
code that scores the baselines, and every number through
`subic_keras.evaluation.retrieval_metrics`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from typing import TYPE_CHECKING, Union

import keras
import numpy as np

from subic_keras.data import images as image_files
from subic_keras.data import protocols
from subic_keras.data.datasets import as_model_inputs as as_model_inputs
from subic_keras.data.paths import find_files
from subic_keras.evaluation import scoring
from subic_keras.instance import folder_rules
from subic_keras.instance.copies import COPY_RULES
from subic_keras.instance.instance_code import InstanceSubic
from subic_keras.models.subic import Subic
from subic_keras.models.weights_digest import weights_digest
from subic_keras.pretrained import INSTANCE
from subic_keras.pretrained import path as pretrained_path
from subic_keras.search import SearchBackend, SubicIndex
from subic_keras.search.base import PictureIndex, Searcher
from subic_keras.search.checks import model_writer
from subic_keras.search.image_index import ImageIndex
from subic_keras.search.instance_codes import InstanceCodes

if TYPE_CHECKING:
    from subic_keras.search.milvus_pictures import MilvusPictures

# What `index_folder` adds a folder's pictures to.
FolderIndex = Union[ImageIndex, "MilvusPictures"]

# A model that writes an index's codes: a class code or an instance code.
Encoder = Subic | InstanceSubic


def build_index(
    subic: Subic,
    images: np.ndarray,
    ids: np.ndarray | None = None,
    batch_size: int = 256,
) -> SubicIndex:
    """Encodes `images` (uint8, or float inputs) into a new `SubicIndex`."""
    index = SubicIndex(subic.num_blocks, subic.block_size)
    index.add(subic.encode(images, batch_size=batch_size), ids=ids)
    return index


def input_shape(subic: Encoder) -> tuple[int, int, int]:
    """The `(H, W, C)` of the pictures `subic` takes."""
    shape = tuple(subic.train_model.input_shape[1:])
    if len(shape) != 3 or None in shape:
        raise ValueError(
            f"the model takes inputs of shape {shape}, not pictures (H, W, C)"
        )
    return shape


@dataclasses.dataclass
class FolderReport:
    """What `index_folder` did with the files of a folder (and, for a Ray
    build, `ray_folders.index_folder_on_ray`, the copy rules it recorded in
    every shard: `choose_copy_rules` does that for one index)."""

    added: int = 0
    already_indexed: int = 0
    skipped: list[image_files.SkippedFile] = dataclasses.field(default_factory=list)
    copy_rules: dict | None = None


def index_folder(
    subic: Encoder,
    root: str | os.PathLike,
    index: FolderIndex | None = None,
    batch_size: int = 256,
    progress: bool = False,
    model_path: str | os.PathLike | None = None,
    instance: InstanceSubic | None = None,
    instance_path: str | os.PathLike | None = None,
) -> tuple[FolderIndex, FolderReport]:
    """Encodes every picture under `root` (recursively) into an `ImageIndex`.

    Files are decoded, resized to the model's input (`subic_keras.data.images`)
    and encoded a batch at a time, so memory does not grow with the number
    of files. A file that is not a decodable picture is skipped and reported,
    never raised; pictures already in `index` (by path) are left as they are.

    Args:
        subic: the model that encodes the pictures.
        root: the folder; paths are stored relative to it.
        index: an `ImageIndex` of the same folder to add to (default: a new
            one), or a Milvus collection of it (`folder_collection`), which
            each batch is added to as it is encoded.
        batch_size: pictures decoded and encoded at a time.
        progress: show a progress bar on standard error (on a terminal).
        model_path: the model's file, recorded by a new index and named in
            messages (`model_record`).
        instance: an instance code (`instance.pretrained()`, say) to keep
            of every picture beside a class code's (`search.instance_codes`:
            copies first). An `index` that keeps instance codes needs the
            instance code that wrote them.
        instance_path: its file (or `"instance"`), recorded with its codes
            so that a search can load it (`instance_encoder`; default: none
            recorded, and the command line cannot search with it).

    Returns:
        `(index, report)`: the index, and the counts of added, already
        indexed and skipped files, with each skipped file's reason.

    Raises:
        ValueError: `index` is of another folder, block shape or image shape.
        NotADirectoryError, FileNotFoundError: `root` is not a folder.
    """
    shape = input_shape(subic)
    paths, skipped = find_files(root)
    if isinstance(subic, InstanceSubic):
        instance = None  # the code is an instance code already
    if index is None:
        both = None if instance is None else (instance.num_blocks, instance.block_size)
        index = ImageIndex(
            subic.num_blocks, subic.block_size, root, shape, instance=both
        )
        index.model = model_record(subic, model_path)
        if index.instance is not None and instance is not None:
            index.instance.model = model_record(instance, instance_path)
    else:
        _check_same_folder(index, subic, root, model_path)
        instance = _check_instance_fits(index, instance, instance_path)
    known = set(index.get_paths())
    new = [path for path in paths if path not in known]
    report = FolderReport(already_indexed=len(paths) - len(new), skipped=skipped)
    from tqdm.auto import tqdm

    bar = tqdm(
        total=len(new), desc="indexing", unit="img", file=sys.stderr,
        disable=None if progress else True, leave=False,
    )  # fmt: skip
    show, subic.show_progress = subic.show_progress, False
    try:
        for batch in image_files.image_batches(root, new, shape, batch_size):
            if batch.paths:
                codes = subic.encode(batch.pixels, batch_size=batch_size)
                more = {}
                if instance is not None:
                    pixels = instance.own_pictures(batch.pixels)
                    more["instance_codes"] = instance.encode(pixels, batch_size)
                index.add(codes, batch.paths, batch.fingerprints, **more)
            report.added += len(batch.paths)
            report.skipped += batch.skipped
            bar.update(len(batch.paths) + len(batch.skipped))
    finally:
        subic.show_progress = show
        bar.close()
    return index, report


def choose_copy_rules(
    index: FolderIndex,
    subic: Encoder,
    instance: InstanceSubic | None = None,
    *,
    sample: int = folder_rules.FOLDER_SAMPLE,
    batch_size: int = 256,
    seed: int = 0,
) -> dict | None:
    """Chooses the copy rules of a folder's index on its own pictures
    (`folder_rules.calibrate_folder`: altered copies of a sample of them, no
    labels) and records them in it (`record_copy_rules`; an `ImageIndex`
    keeps them when saved, a collection at once).

    Example:

    >>> index, _ = index_folder(code, "photos")  # doctest: +SKIP
    >>> rules = choose_copy_rules(index, code)  # doctest: +SKIP
    >>> print(folder_rules.rules_line(rules))  # doctest: +SKIP
    copies: margin -0.8, 61 of 64 blocks; 99 % precise on 2,000 of ...

    Args:
        index: the folder's index, written by `subic` (and `instance`).
        subic: its model: an instance code, or a class code whose index
            keeps `instance`'s codes beside its own.
        instance: that instance code.
        sample: pictures decoded and altered, at most.
        batch_size: pictures decoded and encoded at a time.
        seed: the sample's and the alterations' seed.

    Returns:
        What `calibrate_folder` chose and measured; None for an index of
        class codes alone (it marks exact copies only).
    """
    code = subic if isinstance(subic, InstanceSubic) else instance
    beside = code is not subic
    if code is None or (beside and getattr(index, "instance_model", None) is None):
        return None
    paths, codes, fingerprints = index.copy_items()
    shape = index.image_shape or input_shape(subic)
    rules = folder_copy_rules(
        code, index.root, shape, paths, codes, fingerprints, beside=beside,
        sample=sample, batch_size=batch_size, seed=seed,
    )  # fmt: skip
    index.record_copy_rules(rules)
    return rules


def folder_copy_rules(
    code: InstanceSubic,
    root: str | os.PathLike,
    shape: tuple[int, ...],
    paths: list[str],
    codes: np.ndarray,
    fingerprints: np.ndarray,
    *,
    beside: bool = False,
    sample: int = folder_rules.FOLDER_SAMPLE,
    batch_size: int = 256,
    seed: int = 0,
) -> dict:
    """`folder_rules.calibrate_folder` of a folder's pictures as an index
    lists them (`copy_items`), the sample decoded from their files: what
    `choose_copy_rules` records in one index, and a Ray build in each of
    its shards (`ray_folders.index_folder_on_ray`).

    Args:
        code: the instance code that wrote `codes`.
        root: the folder the `paths` are relative to.
        shape: the pictures' decoded shape (the index's).
        paths, codes, fingerprints: every picture's, in the index's order.
        beside: whether `shape` is a class model's, whose pictures `code`
            takes as its own (`InstanceSubic.own_pictures`).
        sample, batch_size, seed: as `choose_copy_rules`.
    """

    def decode(positions):
        chosen = [paths[place] for place in positions]
        place_of = dict(zip(chosen, positions))
        pictures, decoded = [np.zeros((0, *input_shape(code)), np.uint8)], []
        for batch in image_files.image_batches(root, chosen, shape, batch_size):
            if batch.paths:
                pixels = code.own_pictures(batch.pixels) if beside else batch.pixels
                pictures.append(pixels)
                decoded += [place_of[path] for path in batch.paths]
        return np.concatenate(pictures), np.array(decoded, np.int64)

    show, code.show_progress = code.show_progress, False
    try:
        return folder_rules.calibrate_folder(
            code, codes, fingerprints, decode, sample=sample, seed=seed,
            batch_size=batch_size,
        )  # fmt: skip
    finally:
        code.show_progress = show


def folder_collection(
    uri: str | os.PathLike,
    collection: str,
    subic: Encoder,
    root: str | os.PathLike,
    model_path: str | os.PathLike | None = None,
    instance: InstanceSubic | None = None,
    instance_path: str | os.PathLike | None = None,
) -> MilvusPictures:
    """The Milvus collection of `root`'s pictures that `index_folder` adds
    to: opened where it exists (it must hold pictures of `root`), else
    created for `subic`'s codes (and `instance`'s beside them), recording
    the models as `index_folder` records them in a new `ImageIndex`.

    Raises:
        ValueError: the collection holds codes without paths, of another
            folder or of another block shape.
    """
    from subic_keras.search.milvus_pictures import MilvusPictures

    both: dict = {}
    if instance is not None and not isinstance(subic, InstanceSubic):
        both["instance"] = (instance.num_blocks, instance.block_size)
        both["instance_model"] = model_record(instance, instance_path)
    return MilvusPictures(
        uri, collection, subic.num_blocks, subic.block_size, root=root,
        image_shape=input_shape(subic), model=model_record(subic, model_path),
        **both,
    )  # fmt: skip


def _check_instance_fits(index: FolderIndex, instance, path) -> InstanceSubic | None:
    """The instance code to add to `index` with: None for an index that keeps
    no instance codes, else `instance`, which must be the one that wrote
    them (`check_model_fits`)."""
    codes = getattr(index, "instance", None)
    if codes is None:
        return None
    if instance is None:
        raise ValueError(
            "the index keeps an instance code of every picture: give the instance "
            "code that wrote them (`instance=`)"
        )
    if not isinstance(codes, InstanceCodes):  # a Milvus collection's (M', K')
        codes = InstanceCodes(codes[0], codes[1], index.instance_model)
    check_model_fits(codes, instance, "the index's instance codes", path)
    return instance


def instance_encoder(index: Searcher) -> InstanceSubic | None:
    """The instance code that wrote the instance codes an index keeps beside
    its class codes (None where it keeps none), loaded from the file its
    record names (`"instance"`: the one that ships) and checked to be it.

    Raises:
        ValueError: the file is gone, or holds another model.
    """
    from subic_keras.serving.export import load_encoder

    record = index.instance_model
    if record is None:
        return None
    name = INSTANCE if record.get("file") == INSTANCE else record.get("path")
    if not isinstance(name, str):
        raise ValueError("the index's instance codes record no model file to load")
    if name != INSTANCE and not os.path.isfile(name):
        raise ValueError(
            f"the instance code that wrote the index's instance codes, {name}, "
            "is gone; build the index again (`subic index build`)"
        )
    encoder = load_encoder(name)
    if not isinstance(encoder, InstanceSubic):
        raise ValueError(f"{name} is a class model, not an instance code")
    # What the record says of the codes, checked as an index's own record.
    num_blocks, block_size = record.get("num_blocks"), record.get("block_size")
    if not isinstance(num_blocks, int) or not isinstance(block_size, int):
        raise ValueError("the index's instance codes record no block shape")
    codes = InstanceCodes(num_blocks, block_size, record)
    check_model_fits(codes, encoder, "the index's instance codes", name)
    return encoder


def _check_same_folder(index: FolderIndex, subic: Encoder, root, model_path) -> None:
    if os.path.realpath(index.root) != os.path.realpath(root):
        raise ValueError(
            f"the index holds pictures of {index.root}, received the folder "
            f"{os.path.abspath(root)}"
        )
    check_model_fits(index, subic, model_path=model_path)


def model_record(
    subic: Encoder, path: str | os.PathLike | None = None, file_digest: bool = True
) -> dict:
    """What an index records of the model that writes its codes.

    The digest is a SHA-256 of the model's configuration (`M`, `K`, input
    shape, saved query kind) and of every weight, in order: a model trained
    again, even into the same file, has another.

    Args:
        subic: the model.
        path: its file, named in messages (its base name and absolute path
            are recorded, and the digest of its weights as the file holds
            them, `weights_digest`).
        file_digest: read that digest (False: `weights_file` is None, for a
            check that compares `digest` alone and need not read the file).
    """
    digest = hashlib.sha256()
    config = {
        "num_blocks": subic.num_blocks,
        "block_size": subic.block_size,
        "input_shape": list(input_shape(subic)),
        "query": subic.default_query,
    }
    if isinstance(subic, InstanceSubic) and subic.copy_blocks is not None:
        config.update({rule: getattr(subic, rule) for rule in COPY_RULES})
    digest.update(json.dumps(config, sort_keys=True).encode())
    for weight in subic.train_model.weights:
        value = np.ascontiguousarray(keras.ops.convert_to_numpy(weight))
        digest.update(f"{value.dtype}{value.shape}".encode())
        digest.update(value.tobytes())
    name = where = weights = None
    if path is not None and os.fspath(path) == INSTANCE:  # the one that ships
        name = INSTANCE
        weights = weights_digest(pretrained_path()) if file_digest else None
    elif path is not None:
        name = os.path.basename(os.fspath(path))
        where = os.path.abspath(os.fspath(path))
        weights = weights_digest(path) if file_digest else None
    return {
        "digest": digest.hexdigest(),
        "file": name,
        "path": where,
        # Read from the file without TensorFlow: the command line's check
        # before it loads (`cli.checks`).
        "weights_file": weights,
        **config,
    }


def check_model_fits(
    index: Searcher | InstanceCodes,
    subic: Encoder,
    where: str = "the index",
    model_path=None,
) -> None:
    """Refuses a model whose codes are not the index's: another block
    shape, another input size, or (where the index records the model that
    wrote it) another model altogether.

    An index that records no model (written by an earlier version) cannot
    be checked: a one-line warning on standard error says so, as it says of
    a picture index written with looks by an earlier version (searched by
    its codes alone).

    Raises:
        ValueError: naming the index, both models and what differs.
    """
    if (index.num_blocks, index.block_size) != (subic.num_blocks, subic.block_size):
        raise ValueError(
            f"{where} holds codes of {index.num_blocks} blocks of "
            f"{index.block_size}, but the model makes {subic.num_blocks} blocks of "
            f"{subic.block_size}"
        )
    shape = index.image_shape
    if shape is not None and tuple(shape) != input_shape(subic):
        raise ValueError(
            f"{where} holds pictures decoded to {tuple(shape)}, but the model "
            f"takes {input_shape(subic)}"
        )
    if isinstance(index, PictureIndex) and index.written_with_looks:
        print(
            f"note: {where} was built by an earlier version that ordered ties "
            "by the pictures' looks, which this one no longer uses: it is "
            "searched by its codes alone (build it again for an instance code "
            "of every picture, copies first: subic index build)",
            file=sys.stderr,
        )
    current = model_record(subic, model_path, file_digest=False)
    recorded = index.model
    model = current["path"] or current["file"] or "the model"
    if recorded is None:
        print(
            f"warning: {where} does not record the model that wrote its codes "
            f"(an index of an earlier version), so {model} cannot be checked "
            "against it",
            file=sys.stderr,
        )
        return
    if recorded["digest"] == current["digest"]:
        return
    # An instance code's copy rules are its record's too: they may be all
    # that differs (the same weights calibrated again). A rule absent from a
    # record is none chosen; another key absent, not recorded.
    keys = ("num_blocks", "block_size", "input_shape", "query", *COPY_RULES)
    differs = [
        f"{key} {recorded.get(key)} against {current.get(key)}"
        for key in keys
        if (key in recorded or key in COPY_RULES)
        and recorded.get(key) != current.get(key)
    ] or ["their weights differ"]
    wrote = model_writer(recorded, model)
    raise ValueError(
        f"{where} was written by {wrote} (digest {recorded['digest'][:12]}), not "
        f"by {model} (digest {current['digest'][:12]}): {'; '.join(differs)}; "
        "build the index again with this model (`subic index build`)"
    )


def full_scores(
    index: SearchBackend, queries: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Scores of every query against every indexed item, `(nq, n)`, and the ids.

    Columns follow the index's ids in increasing order; the scores are those
    of `index.search` with `k = len(index)`, so they are exactly SuBiC's
    (`SearchBackend.score_all`).
    """
    return index.score_all(queries)


# The query of the unseen protocol when none is asked for: the class
# posterior, which validation may choose on the training classes, scores
# pictures by classes that held-out pictures are not of; FC0's outputs (the
# paper's z) describe the pictures themselves. At subic train's defaults, 48
# bits, split 0: 0.4165 against 0.4048 (benchmarks/results/
# unseen_classes_full.json), and as much ahead at 24 bits and over 3 splits.
UNSEEN_QUERY = "fc0"


def _scorer_and_database(subic, labels, protocol, seed, index, query, protocol_args):
    """`subic` with queries of kind `query` (`None`: its `default_query`, or
    `UNSEEN_QUERY` on the unseen protocol), and `index`'s codes in protocol
    database order (the index's ids must include the database positions)."""
    if query is None and protocol == "unseen":
        query = UNSEEN_QUERY
    scorer = subic if query is None else subic.with_query(query)
    if index is None:
        return scorer, None
    _, database_idx = protocols.protocol_split(
        protocol, np.asarray(labels), seed=seed, **protocol_args
    )
    ids = np.sort(index.get_ids())
    held = np.isin(database_idx, ids)
    if not held.all():
        raise ValueError(
            f"index must hold the protocol's database, ids = its positions in "
            f"images ({len(database_idx)} items), received an index of "
            f"{len(ids)} items without {int((~held).sum())} of them"
        )
    # An index of the whole split serves any protocol: its database's codes.
    return scorer, index.get_codes(database_idx)


def protocol_scores(
    subic: Subic,
    images: np.ndarray,
    labels: np.ndarray,
    protocol: str = "paper",
    seed: int = 0,
    index: SubicIndex | None = None,
    query: str | None = None,
    **protocol_args,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """SuBiC's scores of a protocol's queries against its whole database.

    `scoring.protocol_scores` with queries of kind `query` (`"fc0"`, the
    paper's `z`, `"class_posterior"`, or `None` for the model's
    `default_query`, `"fc0"` on the `"unseen"` protocol, as `evaluate`);
    `index`, if given, supplies the database codes (its ids must include
    the database's positions in `images`).

    Returns:
        `(scores, query_labels, database_labels, database_codes)`: scores
        `(num_queries, num_database)` with columns in database order, ready
        for any `subic_keras.evaluation.retrieval_metrics` metric.
    """
    scorer, database = _scorer_and_database(
        subic, labels, protocol, seed, index, query, protocol_args
    )
    return scoring.protocol_scores(
        scorer,
        images,
        labels,
        protocol,
        seed=seed,
        database=database,
        **protocol_args,
    )


def evaluate(
    subic: Subic,
    images: np.ndarray,
    labels: np.ndarray,
    protocol: str = "paper",
    seed: int = 0,
    index: SubicIndex | None = None,
    ks: tuple[int, ...] = (10, 100),
    ties: str = "pessimistic",
    query: str | None = None,
    **protocol_args,
) -> dict:
    """Retrieval mAP and precision@k of `subic` on a named protocol.

    `scoring.evaluate` with queries of kind `query` (`None`: the model's
    `default_query`, and on the `"unseen"` protocol FC0's outputs, the
    paper's `z`: the class posterior scores by the training classes, which
    held-out pictures are not of) and, optionally, the database codes of
    `index`.

    Returns:
        A JSON-ready dict: `map` (with `ties`), `map_expected` (the exact
        expectation over random orders of tied items: codes shared by many
        images make large tie groups, where the pessimistic and expected APs
        differ), `map_21point`, `precision@k`, `recall@k`, the protocol,
        query kind, bits, sizes and the tie handling.
    """
    scorer, database = _scorer_and_database(
        subic, labels, protocol, seed, index, query, protocol_args
    )
    return scoring.evaluate(
        scorer,
        images,
        labels,
        protocol,
        seed=seed,
        database=database,
        ks=ks,
        ties=ties,
        **protocol_args,
    )
