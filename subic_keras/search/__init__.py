"""SuBiC's asymmetric search: backends, engines, sharding and the file format.

A database item is an integer code `c` of `M` blocks with values in `[0, K)`;
a query is SuBiC's real vector `z*` of width `M * K`. The score is a
look-up-table scan with `M` additions (paper Sec. 3.3):

    score(z*, c) = sum_m z*[m*K + c_m]

One module per concept:

- `base`: the backend interface (`Searcher`, `SearchBackend`), the tie and
  missing-result conventions every backend follows, and the input checks
  backends share.
- `subic_index`: `SubicIndex`, the in-memory backend over faiss.
- `image_index`: `ImageIndex`, a `SubicIndex` of a folder's pictures with
  each one's path, in one file (`subic index build FOLDER`).
- `engines`: the scans behind it: the native exact scan where it was built,
  else faiss's (exact scan for any `K`; 4-bit SIMD fast scan with exact
  re-scoring for `K = 16`).
- `native`: the native exact scan (`_scan.c`): SIMD bounds from quantised
  look-up tables, exact float64 refinement, the same top-k as a brute force.
- `sharding`: `ShardedSubicIndex` (shards in one process) and
  `merge_results` (shards on several machines).
- `file_format`: the byte-level specification of `.subic` files.
- `packing`: the bit packing of codes (`M * log2 K` bits per item).

faiss implements neither `IndexPQ` nor the fast-scan indexes on GPU, so
searches run on CPU cores, with or without faiss-gpu. The fast-scan path
holds fewer than 2**31 items per index (a faiss limit).

Storage. `M * log2(K)` bits per item (`code_size` bytes, padded to whole
bytes) plus an int64 id; `bytes_per_item` reports the in-memory cost. The
fast-scan layout rounds `M` up to an even number of blocks.
"""

from subic_keras.search.base import SearchBackend, Searcher
from subic_keras.search.image_index import ImageIndex
from subic_keras.search.sharding import ShardedSubicIndex, merge_results
from subic_keras.search.subic_index import SubicIndex

__all__ = [
    "ImageIndex",
    "SearchBackend",
    "Searcher",
    "ShardedSubicIndex",
    "SubicIndex",
    "merge_results",
]
