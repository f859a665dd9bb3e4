"""What `subic search`, `duplicates`, `train-instance` and `serve` do;
loaded (with TensorFlow) only to run one (re-exported by `commands`)."""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

from subic_keras._io import check_file
from subic_keras.cli.console import plural, printable
from subic_keras.cli.loading import join_ray, load_model, open_index, open_pictures
from subic_keras.data import images as image_files
from subic_keras.data.paths import open_file
from subic_keras.instance import copies, folder_rules
from subic_keras.instance.instance_code import InstanceSubic
from subic_keras.search import filters
from subic_keras.serving import retrieval
from subic_keras.serving.sockets import listen


def _npy_bytes(handle) -> tuple[int, int]:
    """The bytes a `.npy` file's header claims for its array, and the bytes
    that follow the header; `handle` is left at the start."""
    from numpy.lib import format as npy

    version = npy.read_magic(handle)
    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
    shape, _, dtype = read(handle)
    held = os.fstat(handle.fileno()).st_size - handle.tell()
    handle.seek(0)
    return math.prod(shape) * dtype.itemsize, held


def _read_npy(path: str, shape) -> np.ndarray:
    """Images `(n, *shape)` from a `.npy` file (one image may lack the `n`).

    The header's claim is checked before NumPy allocates it: no more than
    the file holds, nor than a file may take (`images.FILE_DECODE_BYTES`).
    """
    limit = image_files.FILE_DECODE_BYTES
    with open_file(path) as handle:
        try:
            claimed, held = _npy_bytes(handle)
            if claimed <= min(held, limit):
                array = np.load(handle, allow_pickle=False)
        except (ValueError, EOFError) as error:
            raise ValueError(f"not a NumPy .npy array ({error}) ({path})") from None
    if claimed > limit:
        raise ValueError(
            f"query array too large: {claimed / 1e6:.0f} MB, more than the "
            f"{limit / 1e6:.0f} MB a file is read with ({path})"
        )
    if claimed > held:
        raise ValueError(
            f"truncated .npy array: its header claims {claimed:,} bytes, the file "
            f"holds {held:,} ({path})"
        )
    shape = tuple(shape)
    if shape[-1] == 1 and array.shape[-2:] == shape[:2]:
        array = array[..., None]  # grey images without a channel axis
    if array.shape == shape:
        array = array[None]  # one image
    if array.dtype != np.uint8 and array.dtype.kind != "f":
        raise ValueError(
            f"query images must be uint8 pixels or floats in [0, 1], received "
            f"dtype {array.dtype} ({path})"
        )
    if array.shape[1:] != tuple(shape):
        raise ValueError(
            f"query images must have shape (n, {', '.join(map(str, shape))}), "
            f"received {array.shape} ({path})"
        )
    if array.dtype.kind == "f":
        finite = np.isfinite(array)
        if not finite.all() or (array.size and (array.min() < 0 or array.max() > 1)):
            low, high = (
                (array[finite].min(), array[finite].max()) if finite.any() else (0, 0)
            )
            raise ValueError(
                "float query images must hold pixels in [0, 1] (or save uint8 "
                f"pixels in [0, 255]), received values in [{low:g}, {high:g}]"
                + ("" if finite.all() else " and NaN or infinity")
                + f" ({path})"
            )
        return array.astype(np.float32)
    return array


def _read_image(path: str, shape) -> np.ndarray:
    """One encoded image file, decoded to the model's `(H, W, C)`."""
    try:
        return image_files.read_image(path, shape)[None]
    except image_files.ImageDecodeError as error:
        raise ValueError(f"{error}: a query is a picture or a .npy array") from None


def _read_query_images(
    paths: list[str], shape
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Query images from `.npy` arrays (uint8 `(n, H, W[, C])`) or image
    files, and the fingerprints of their pixels (0 for float arrays)."""
    shape = tuple(shape)
    names, batches = [], []
    for path in paths:
        check_file(path, "query image file")
        if path.endswith(".npy"):
            array = _read_npy(path, shape)
            names += [f"{path}[{i}]" for i in range(len(array))]
        else:
            array = _read_image(path, shape)
            names.append(path)
        batches.append(array)
    fingerprints = np.array(
        [
            image_files.fingerprint(image) if batch.dtype == np.uint8 else 0
            for batch in batches
            for image in batch
        ],
        dtype=np.uint64,
    )
    if len({batch.dtype for batch in batches}) > 1:
        batches = [retrieval.as_model_inputs(batch) for batch in batches]
    return names, np.concatenate(batches), fingerprints


def run_search(args) -> int:
    paths = args.images
    condition = _where(args)  # a bad filter is said before anything loads
    subic = load_model(args.model, instance=True)
    index, where = open_index(args, args.index)
    if isinstance(subic, InstanceSubic) and getattr(index, "instance_model", None):
        index = index.by_instance()  # the instance codes kept beside a class code's
    retrieval.check_model_fits(index, subic, where, args.model)
    names, images, fingerprints = _read_query_images(
        paths, retrieval.input_shape(subic)
    )
    queries = subic.query(images, kind=args.query)
    more = {}
    instance = (
        None if isinstance(subic, InstanceSubic) else retrieval.instance_encoder(index)
    )
    if instance is not None:  # the index keeps an instance code beside the class's
        more["instance_queries"] = instance.query(instance.own_pictures(images))
    # At most len(index) columns come back, whatever -k says; a Milvus
    # collection may leave some empty (id -1).
    answers = index.answer(
        queries, args.k, where=condition, fingerprints=fingerprints, **more
    )
    margin = copies.copy_margin_for(index, subic)  # the folder's rule
    copies.mark(answers, queries, subic.block_size, margin, marked=bool(more))
    for name, matches in zip(names, answers):
        _print_matches(name, [{"query": name, **match} for match in matches], args.json)
    if condition is not None and len(index) and not any(answers):
        # Said on standard error: `--json` keeps standard output parseable.
        given = " and ".join(
            option
            for option, value in (("--where", args.where), ("--under", args.under))
            if value is not None
        )
        print(
            f"subic search: no item of {printable(os.fspath(args.index))} passes "
            f"{given}: no match",
            file=sys.stderr,
        )
        return 1
    return 0


def _where(args) -> filters.Filter | None:
    """`--where EXPR` and `--under FOLDER`, both if both are given."""
    where = filters.parse(args.where) if args.where is not None else None
    if args.under is not None:
        under = filters.Under(args.under)
        where = under if where is None else where & under
    return where


def _print_matches(name: str, matches: list[dict], as_json: bool) -> None:
    if as_json:
        for match in matches:
            print(json.dumps(match))
        return
    print(printable(name))
    for match in matches:
        path = match["path"]
        where = printable(path) if path is not None else f"id {match['id']}"
        note = "  (the query itself)" if match["exact"] else ""
        note = note or ("  (a copy)" if match.get("copy") else "")
        print(f"  {match['rank']:>4}  {match['score']:>10.4f}  {where}{note}")


def run_duplicates(args) -> int:
    index = open_pictures(args, args.index, shards=True)
    groups = index.duplicates(args.copy_blocks)
    if args.json:
        for group in groups:
            print(json.dumps({"paths": group}))
    else:
        for number, group in enumerate(groups, 1):
            print(f"group {number}: {plural(len(group), 'picture')}")
            for path in group:
                print(f"  {printable(path)}")
    found = sum(len(group) for group in groups)
    print(
        f"{plural(len(groups), 'group')} of copies ({plural(found, 'picture')}) "
        f"among {plural(len(index), 'picture')} of {printable(os.fspath(args.index))}",
        file=sys.stderr,
    )
    return 0


def run_train_instance(args) -> int:
    from subic_keras.instance.folder_training import train_on_folder

    code = load_model(args.start, instance=True)
    if not isinstance(code, InstanceSubic):
        raise ValueError(
            f"--from names a class model ({args.start}); give an instance code "
            "(`instance`, or a .keras file written by `subic train-instance`)"
        )
    done = train_on_folder(
        code,
        args.folder,
        epochs=args.epochs,
        batch_size=args.batch_size,
        verbose=2,
        checkpoint=args.output,
    )
    if done["resumed_at"]:
        print(
            f"resumed after epoch {done['resumed_at']} of {args.epochs} "
            f"(from {printable(os.fspath(args.output))}.epoch-*.keras)",
            file=sys.stderr,
        )
    code.save(args.output, include_optimizer=False, replace=args.overwrite)
    for skipped in done["skipped"]:
        print(f"skipped {printable(skipped.path)}: {skipped.reason}", file=sys.stderr)
    rules = done["calibration"]
    print(
        f"trained on {plural(done['pictures'], 'picture')} of "
        f"{printable(os.fspath(args.folder))} (loss {done['loss']:.4f}); "
        f"wrote {printable(os.fspath(args.output))}"
    )
    recall = done["recall"]
    print(
        f"copies found first (recall@1) of {plural(recall['held_out'], 'picture')} "
        f"held out of the training: {recall['before']:.3f} before, "
        f"{recall['after']:.3f} after"
    )
    chosen = {name: rules[name]["value"] for name in copies.COPY_RULES}
    line = {
        **chosen,
        "copies": rules["queries"],
        "precision": rules["precision_target"],
        "num_blocks": code.num_blocks,
    }
    if chosen["copy_margin"] is None and chosen["copy_blocks"] is None:
        line["reason"] = (
            f"none chosen, because no rule reached {100 * line['precision']:g} % "
            f"precise on {line['copies']:,} of the folder's own copies"
        )
    print(folder_rules.rules_line(line))
    return 0


def run_serve(args) -> int:
    from subic_keras.serving import http_app, server

    # Listened on by the command line's checks (a busy port is said before
    # TensorFlow loads); called otherwise, here.
    sock = getattr(args, "socket", None) or listen(args.host, args.port)
    join_ray(args, args.index)
    service = server.SearchService(
        args.model,
        args.index,
        query=args.query,
        max_upload_bytes=int(args.max_upload_mb * 1e6),
        scanner=args.scanner,
        folder=args.folder,
        decode_bytes=int(args.max_decode_mb * 1e6),
        collection=args.collection,
    )
    http_app.run(service, sock=sock)
    return 0
