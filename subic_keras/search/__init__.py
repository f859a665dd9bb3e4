"""SuBiC's asymmetric search: backends, engines, sharding and the file format.

A database item is an integer code `c` of `M` blocks with values in `[0, K)`;
a query is SuBiC's real vector `z*` of width `M * K`. The score is a
look-up-table scan with `M` additions (paper Sec. 3.3):

    score(z*, c) = sum_m z*[m*K + c_m]

One module per concept:

- `base`: the backend interface (`Searcher`, `SearchBackend`): public
  methods check their arguments once and call the backend's private ones;
  the tie and missing-result conventions; the input checks backends share.
- `store`: `CodeStore`, the packed codes and ids of an index (what a
  `.subic` file holds).
- `scanners`: what ranks a store: the native exact scan with each SIMD
  kernel (`native-vbmi`, `native-avx512bw`, `native-avx2`, `native-neon`,
  `native-portable`),
  faiss's exact scan and faiss's 4-bit fast scan; `available(M, K)` lists
  those this machine runs, `SubicIndex(..., scanner=...)` picks one.
- `native`: the native exact scan (`_scan.c`): SIMD bounds from quantised
  look-up tables, exact float64 refinement, the same top-k as a brute force.
- `subic_index`: `SubicIndex`, a store and a scanner, in memory.
- `image_index`: `ImageIndex`, a `SubicIndex` of a folder's pictures with
  each one's path, in one file (`subic index build FOLDER`).
- `sharding`: `ShardedSubicIndex` (shards in one process) and
  `merge_results` (shards on several machines).
- `milvus`: `MilvusIndex`, codes in a Milvus collection (Milvus Lite or a
  server).
- `uri`: `open(uri)`, one address for every backend (a `.subic` file, a
  Milvus Lite `.db`, a Milvus server URL).
- `file_format`: the byte-level specification of `.subic` files.
- `packing`: the bit packing of codes (`M * log2 K` bits per item).

faiss is needed for its own scanners and the quantizer baselines only: where
the native scan was built, search runs without it. faiss implements neither
`IndexPQ` nor its fast scan on GPU, so every scan runs on CPU cores.

Storage. `M * log2(K)` bits per item (`code_size` bytes, padded to whole
bytes) plus an int64 id; `bytes_per_item` reports it. Scanners keep their
own layouts beside it (the native kernels' tiles: about `code_size` bytes
per item again).
"""

from subic_keras.search import scanners
from subic_keras.search.base import SearchBackend, Searcher
from subic_keras.search.image_index import ImageIndex
from subic_keras.search.sharding import ShardedSubicIndex, merge_results
from subic_keras.search.subic_index import SubicIndex
from subic_keras.search.uri import open

__all__ = [
    "ImageIndex",
    "SearchBackend",
    "Searcher",
    "ShardedSubicIndex",
    "SubicIndex",
    "merge_results",
    "open",
    "scanners",
]
