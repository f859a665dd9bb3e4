"""What a SuBiC collection is in Milvus: its fields and recorded properties.

A collection holds, per item, an `id` (the primary key), `seq` (insertion
order, which orders equal scores) and `code`, the class code's sparse
one-hot vector; a collection made with an instance code (`instance=(M', K')`)
holds `instance_code` too, a second sparse vector field with its own
`SPARSE_INVERTED_INDEX`, so that one collection answers by either code.

Its properties record the format's version, the codes' shapes, the models
that wrote them and the counters of `MilvusIndex.add`:

- format 1: `subic.num_blocks`, `subic.block_size`, optionally
  `subic.model`;
- format 2 (written only for a collection with instance codes, so that a
  collection without them stays readable by earlier versions): format 1's,
  and `subic.instance_num_blocks`, `subic.instance_block_size`, optionally
  `subic.instance_model`;
- format 3, a folder's pictures (`milvus_pictures`): format 1's, format
  2's where it keeps instance codes, `subic.root` (the folder's absolute
  path) and optionally `subic.image_shape` (a JSON list); its items hold
  the fields of an `ImageIndex`'s table (`items`) too: `path`, `class`,
  `fingerprint` (the uint64 stored as the int64 of the same bits), `added`
  and `attributes` (JSON, each value under its kind and name,
  `{"number:year": 2024}`, so that a filter reads the values of its kind).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from subic_keras._validation import check_int, load_json
from subic_keras.search.checks import (
    check_block_size,
    check_codes,
    check_model_record,
    check_num_blocks,
)
from subic_keras.search.items import check_table_metadata

READ_VERSIONS = ("1", "2", "3")
CODE, INSTANCE_CODE = "code", "instance_code"
MAX_PATH = 65_535  # bytes: Milvus's longest VARCHAR
_PROPERTIES = ("subic.format", "subic.num_blocks", "subic.block_size")
_INSTANCE = ("subic.instance_num_blocks", "subic.instance_block_size")


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What a collection records about its codes."""

    num_blocks: int
    block_size: int
    model: dict | None = None
    instance: tuple[int, int] | None = None  # (M', K') of its instance codes
    instance_model: dict | None = None
    root: str | None = None  # a folder's pictures (format 3)
    image_shape: tuple[int, ...] | None = None

    def shape(self, instance: bool = False) -> tuple[int, int]:
        """`(M, K)` of the class codes, or of the instance codes."""
        if not instance:
            return self.num_blocks, self.block_size
        if self.instance is None:
            raise ValueError("the collection keeps no instance codes")
        return self.instance


def create(client, pymilvus, name: str, recorded: Recorded, options: dict) -> None:
    """Creates collection `name` for `recorded`'s codes (Milvus's
    `create_collection` `options`, e.g. `num_shards`), its counters at 0."""
    for shape in (recorded.num_blocks, recorded.block_size), recorded.instance:
        if shape is not None and shape[0] * shape[1] > 2**31:
            raise ValueError(
                "num_blocks * block_size must fit Milvus's sparse dimensions "
                f"(2**31), received {shape[0]} * {shape[1]}"
            )
    fields = (CODE,) if recorded.instance is None else (CODE, INSTANCE_CODE)
    DataType = pymilvus.DataType
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("seq", DataType.INT64)
    index = client.prepare_index_params()
    for field in fields:
        schema.add_field(field, DataType.SPARSE_FLOAT_VECTOR)
        index.add_index(
            field_name=field, index_type="SPARSE_INVERTED_INDEX", metric_type="IP"
        )
    version = "1" if recorded.instance is None else "2"
    if recorded.root is not None:
        version = "3"
        schema.add_field("path", DataType.VARCHAR, max_length=MAX_PATH)
        schema.add_field("class", DataType.VARCHAR, max_length=MAX_PATH)
        schema.add_field("fingerprint", DataType.INT64)
        schema.add_field("added", DataType.DOUBLE)
        schema.add_field("attributes", DataType.JSON)
    properties = {
        "subic.format": version,
        "subic.num_blocks": str(recorded.num_blocks),
        "subic.block_size": str(recorded.block_size),
        "subic.next_id": "0",
        "subic.next_seq": "0",
    }
    if recorded.model is not None:
        properties["subic.model"] = json.dumps(recorded.model)
    if recorded.instance is not None:
        properties[_INSTANCE[0]] = str(recorded.instance[0])
        properties[_INSTANCE[1]] = str(recorded.instance[1])
        if recorded.instance_model is not None:
            properties["subic.instance_model"] = json.dumps(recorded.instance_model)
    if recorded.root is not None:
        properties["subic.root"] = recorded.root
        if recorded.image_shape is not None:
            properties["subic.image_shape"] = json.dumps(list(recorded.image_shape))
    client.create_collection(
        name,
        schema=schema,
        index_params=index,
        consistency_level="Strong",
        properties=properties,
        **options,
    )


def read(properties: dict, where: str) -> Recorded:
    """The codes a collection's `properties` record, checked.

    Args:
        properties: the collection's properties, as Milvus describes them.
        where: how messages name the collection.

    Raises:
        ValueError: not a SuBiC collection, a format this version does not
            read, or an invalid shape or model record.
    """
    if any(name not in properties for name in _PROPERTIES):
        raise ValueError(
            f"{where} is not a SuBiC collection: its properties lack "
            f"{list(_PROPERTIES)}"
        )
    version = properties["subic.format"]
    if version not in READ_VERSIONS:
        raise ValueError(
            f"{where} has SuBiC format version {version}; this version of "
            f"subic_keras reads versions {', '.join(READ_VERSIONS)}"
        )
    try:
        shape = _shape(properties, "subic.num_blocks", "subic.block_size")
        instance = None
        if version == "2" or _INSTANCE[0] in properties:
            missing = [name for name in _INSTANCE if name not in properties]
            if missing:
                raise ValueError(f"format {version} needs {missing}")
            instance = _shape(properties, *_INSTANCE)
        model = _model(properties, "subic.model")
        instance_model = _model(properties, "subic.instance_model")
        root, image_shape = _folder(properties) if version == "3" else (None, None)
    except ValueError as error:
        raise ValueError(
            f"{where} records an invalid shape, model or folder: {error}"
        ) from None
    return Recorded(*shape, model, instance, instance_model, root, image_shape)


def check_instance(instance) -> tuple[int, int]:
    """`instance=`, the `(M', K')` of the items' instance codes, checked."""
    if not isinstance(instance, (tuple, list)) or len(instance) != 2:
        raise ValueError(
            f"instance must be (num_blocks, block_size), received {instance!r}"
        )
    num_blocks = check_num_blocks(check_int("instance[0]", instance[0], minimum=1))
    return num_blocks, check_block_size(instance[1], "instance[1]")


def columns(
    codes: np.ndarray, recorded: Recorded, instance_codes, name: str
) -> dict[str, np.ndarray]:
    """The non-zero columns `m*K + c_m` of each field's sparse vectors, for
    `codes` (checked) and `instance_codes` (checked here: required by a
    collection with instance codes, refused by one without)."""
    fields = {CODE: _columns(codes, recorded.block_size)}
    if recorded.instance is not None:
        if instance_codes is None:
            raise ValueError(
                f"instance_codes must be given: collection {name!r} keeps an "
                "instance code of every item"
            )
        instance_codes = check_codes(
            "instance_codes", instance_codes, *recorded.instance
        )
        if len(instance_codes) != len(codes):
            raise ValueError(
                f"instance_codes must hold one code per item ({len(codes)}), "
                f"received {len(instance_codes)}"
            )
        fields[INSTANCE_CODE] = _columns(instance_codes, recorded.instance[1])
    elif instance_codes is not None:
        raise ValueError(
            f"instance_codes were given, but collection {name!r} keeps none "
            "(create it with instance=(num_blocks, block_size))"
        )
    return fields


def _columns(codes: np.ndarray, block_size: int) -> np.ndarray:
    return codes.astype(np.int64) + np.arange(codes.shape[1]) * block_size


def codes_of(vectors: list[dict], num_blocks: int, block_size: int) -> np.ndarray:
    """Integer codes `(n, M)` of stored sparse vectors (`columns`' inverse)."""
    dtype = np.uint8 if block_size <= 256 else np.uint16
    codes = np.zeros((len(vectors), num_blocks), dtype=dtype)
    offsets = np.arange(num_blocks) * block_size
    for i, vector in enumerate(vectors):
        codes[i] = np.sort(np.fromiter(vector.keys(), dtype=np.int64)) - offsets
    return codes


def sparse_queries(
    queries: np.ndarray, num_blocks: int, block_size: int
) -> tuple[list[dict[int, float]], np.ndarray]:
    """Checked queries `(nq, M*K)` as Milvus's sparse vectors, and the
    offsets to add to the scores Milvus returns for them.

    Milvus takes non-negative sparse weights only. Every code holds one
    entry per block, so raising a block's entries by a constant raises every
    item's score by it: each block with negative entries is shifted so that
    its least entry is 0, the ranking is unchanged, and the shifts are taken
    off the scores again (float64 shifts, so a class-posterior query is
    served exactly as `SubicIndex` serves it).
    """
    blocks = np.asarray(queries, np.float64).reshape(
        len(queries), num_blocks, block_size
    )
    shifts = np.minimum(blocks.min(axis=2, keepdims=True), 0.0)
    shifted = (blocks - shifts).reshape(len(queries), -1)
    sparse = [{int(j): float(row[j]) for j in np.flatnonzero(row)} for row in shifted]
    return sparse, shifts.sum(axis=(1, 2))


def _shape(properties: dict, blocks: str, size: str) -> tuple[int, int]:
    try:
        num_blocks, block_size = int(properties[blocks]), int(properties[size])
    except ValueError:
        raise ValueError(
            f"{blocks} and {size} must be integers, received "
            f"{properties[blocks]!r} and {properties[size]!r}"
        ) from None
    return (
        check_num_blocks(check_int(blocks, num_blocks, minimum=1)),
        check_block_size(block_size, size),
    )


def _folder(properties: dict) -> tuple[str, tuple[int, ...] | None]:
    """The folder and image shape a collection of pictures records,
    checked as an index file's are (`items.check_table_metadata`)."""
    root = properties.get("subic.root")
    if not isinstance(root, str):
        raise ValueError(f"format 3 needs subic.root, the folder, received {root!r}")
    text = properties.get("subic.image_shape")
    return check_folder(root, None if text is None else load_json(text))


def check_folder(root: str, image_shape) -> tuple[str, tuple[int, ...] | None]:
    """A collection's folder (an absolute path) and the pictures' shape
    (`[H, W, C]`, or None), checked as an index file's are
    (`items.check_table_metadata`)."""
    metadata = {"format": "milvus", "root": root, "image_shape": image_shape}
    root, shape, _ = check_table_metadata(metadata, "milvus")
    return root, None if shape is None else tuple(shape)


def _model(properties: dict, name: str) -> dict | None:
    text = properties.get(name)
    return None if text is None else check_model_record(name, load_json(text))
