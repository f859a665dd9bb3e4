"""SuBiC's asymmetric search: indexes, scanners, filters and the file format.

A database item is an integer code `c` of `M` blocks with values in `[0, K)`;
a query is SuBiC's real vector `z*` of width `M * K`. The score is a
look-up-table scan with `M` additions (paper Sec. 3.3):

    score(z*, c) = sum_m z*[m*K + c_m]

Every index is a `Searcher` (`search(queries, k, where=...)`, `answer`,
`search_codes`), opened from its address by `open(uri)`. One module per
concept:

- `base`: the interfaces (`Searcher`, `SearchBackend`), their conventions,
  and `answer_rows`, the one place where results become rows.
- `checks`: the input checks every backend shares; `locks`: the
  read-write lock.
- `filters`: the `where=` expression language, evaluated to one boolean per
  item; `items`: `ItemTable`, what an index records of each item beside
  its code (path, class, fingerprint, time added, attributes).
- `store`: `CodeStore`, the packed codes and ids of an index.
- `scanners`: the registry of what ranks a store, by name; `scanner`: what
  every scanner is; `native_scanner`: the native exact scan with each SIMD
  kernel (`native-vbmi`, `native-avx512bw`, `native-avx2`, `native-neon`,
  `native-portable`; `native` and `_scan.c` hold the kernels);
  `faiss_scanners`: faiss's exact scan and its 4-bit fast scan. Every one
  takes a filter inside its scan.
- `subic_index`: `SubicIndex`, a store and a scanner, in memory.
- `image_index`: `ImageIndex`, a `SubicIndex` and an `ItemTable`: a
  folder's pictures, in one file (`subic index build FOLDER`);
  `picture_shard_answers`: what one answers as a shard.
- `copy_rules`: which results are copies of their query (`mark`) and
  which stored codes copy each other (`duplicate_groups`).
- `instance_codes`: an instance code kept beside the class code of an
  `ImageIndex` (`instance=`), and the answer of both: the query's copies
  first, equal class scores by instance score.
- `sharding`: `ShardedSubicIndex` (shards in one process) and
  `merge_results` (shards on several machines).
- `manifests`: shard manifests, `save_shards`, and how rebuilds and open
  indexes share a folder.
- `ray_index`: `RayIndex`, the shards of a manifest in Ray actors, on one
  machine or a cluster.
- `milvus`: `MilvusIndex`, codes in a Milvus collection (Milvus Lite or a
  server), with `instance=` each item's instance code in a second field;
  `milvus_schema`: the collection's fields and recorded properties;
  `milvus_pictures`: `MilvusPictures`, a folder's pictures in a
  collection (paths beside both codes), a `PictureIndex`.
- `addresses`: which addresses name a Milvus database, checked without
  pymilvus.
- `uri`: `open(uri)`, one address for every index (a `.subic` file, a
  shard manifest `.shards.json`, a Milvus Lite `.db`, a Milvus server
  URL), and the one place that tells the kinds of index file apart.
- `file_format`: the byte-level specification of `.subic` files.
- `packing`: the bit packing of codes (`M * log2 K` bits per item).

A new backend is a `Searcher` in a module of its own, named by `uri`; a
new SIMD kernel goes in `_scan.c`, bound by `native` and registered in
`native_scanner`.

faiss is needed for its own scanners and the quantizer baselines only: where
the native scan was built, search runs without it. faiss implements neither
`IndexPQ` nor its fast scan on GPU, so every scan runs on CPU cores.

Storage. `M * log2(K)` bits per item (`code_size` bytes, padded to whole
bytes) plus an int64 id; `bytes_per_item` reports it. Scanners keep their
own layouts beside it (the native kernels' tiles: about `code_size` bytes
per item again).
"""

from subic_keras.search import filters, scanners
from subic_keras.search.base import SearchBackend, Searcher, answer_rows
from subic_keras.search.filters import Filter
from subic_keras.search.image_index import ImageIndex
from subic_keras.search.manifests import save_shards
from subic_keras.search.ray_index import RayIndex
from subic_keras.search.sharding import ShardedSubicIndex, merge_results
from subic_keras.search.subic_index import SubicIndex
from subic_keras.search.uri import open

__all__ = [
    "Filter",
    "ImageIndex",
    "RayIndex",
    "SearchBackend",
    "Searcher",
    "ShardedSubicIndex",
    "SubicIndex",
    "answer_rows",
    "filters",
    "merge_results",
    "open",
    "save_shards",
    "scanners",
]
