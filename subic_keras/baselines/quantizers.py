"""Unsupervised vector quantizers from faiss: the paper's PQ, CKM and LSQ.

Each encodes a feature vector as `M` integers in `[0, K)`, `K = 2**nbits`,
i.e. `M·nbits` bits (the paper compares them with SuBiC at 64 bits: `M = 8`,
`nbits = 8`), and searches by *asymmetric distance computation* (ADC): the
query stays real, the database holds codes, and the score of a code is
read from per-query look-up tables, `M` additions per database item:

`score(q, c) = −‖q − x̂(c)‖²`, `x̂(c)` the reconstruction of code `c`.

- `ProductQuantizer` (PQ, Jégou et al. 2011): `x̂ = [C_1[c_1]; …; C_M[c_M]]`,
  one k-means codebook per block of `d/M` dimensions.
- `OptimizedProductQuantizer` (OPQ, Ge et al. 2013, "Cartesian k-means",
  CKM in the paper, Norouzi & Fleet 2013): PQ after a learned rotation `R`,
  `x̂ = Rᵀ [C_1[c_1]; …; C_M[c_M]]`.
- `LocalSearchQuantizer` (LSQ, Martinez et al. 2018): additive codebooks over
  the full space, `x̂ = Σ_m C_m[c_m]`, encoded by iterated local search.

Integer codes follow SuBiC's convention: `(n, M)` int32 arrays with values in
`[0, K)`, so that they go straight into `subic_keras.evaluation.retrieval_metrics`.
"""

from __future__ import annotations

import abc
import warnings

import faiss
import numpy as np

from subic_keras._validation import check_features, check_int
from subic_keras.evaluation import retrieval_metrics as evaluation
from subic_keras.evaluation.scoring import Scorer

# faiss prints a warning below 39 training points per centroid; we warn from
# Python instead, so that callers can filter it.
_MIN_POINTS_PER_CENTROID = 39
_MAX_BITS_PER_CODEBOOK = 16
# Scores computed at a time (queries × database items) in `asymmetric_scores`.
_CHUNK_ELEMENTS = 1 << 22


class Quantizer(Scorer):
    """A vector quantizer with `M` codebooks of `K = 2**nbits` codewords.

    Subclasses train and apply one faiss quantizer; this class validates
    every input, converts faiss's packed bytes to integer codes and back, and
    scans the database in chunks of queries.

    Args:
        num_codebooks: the number of codebooks `M >= 1`.
        bits_per_codebook: `nbits`, from 1 to 16; each codebook has
            `K = 2**nbits` codewords.
    """

    def __init__(self, num_codebooks: int, bits_per_codebook: int = 8):
        self.num_codebooks = check_int("num_codebooks", num_codebooks, minimum=1)
        self.bits_per_codebook = check_int(
            "bits_per_codebook", bits_per_codebook, minimum=1
        )
        if self.bits_per_codebook > _MAX_BITS_PER_CODEBOOK:
            raise ValueError(
                f"bits_per_codebook must be <= {_MAX_BITS_PER_CODEBOOK}, received "
                f"{self.bits_per_codebook}"
            )
        self.dim: int | None = None

    @property
    def bits(self) -> int:
        """Bits per code, `M·nbits`."""
        return self.num_codebooks * self.bits_per_codebook

    @property
    def codebook_size(self) -> int:
        """Codewords per codebook, `K = 2**nbits`."""
        return 1 << self.bits_per_codebook

    @property
    def is_fitted(self) -> bool:
        return self.dim is not None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_codebooks={self.num_codebooks}, "
            f"bits_per_codebook={self.bits_per_codebook}, dim={self.dim})"
        )

    def fit(self, features: np.ndarray, seed: int = 0) -> Quantizer:
        """Trains the codebooks on `features`.

        Args:
            features: `(n, d)` real training vectors, `n >= K`; fewer than
                39 per codeword trains but warns (as faiss does).
            seed: the seed of faiss's random initialisations.

        Returns:
            `self`, fitted.

        Raises:
            ValueError: on non-finite or non-2-D features, fewer than `K`
                of them, or `d` not suited to the quantizer.
            TypeError: on non-numeric features.
        """
        features = check_features("features", features)
        seed = check_int("seed", seed, minimum=0)
        n, dim = features.shape
        self._check_shape(n, dim)
        k = self.codebook_size
        if n < k:
            raise ValueError(
                f"features must have at least 2**bits_per_codebook = {k} rows to "
                f"train {k} codewords per codebook, received {n}"
            )
        if n < _MIN_POINTS_PER_CENTROID * k:
            warnings.warn(
                f"training {k} codewords per codebook on {n} points; "
                f"{_MIN_POINTS_PER_CENTROID * k} or more are advised",
                UserWarning,
                stacklevel=2,
            )
        self._fit(features, seed)
        self.dim = dim
        return self

    def encode(self, features: np.ndarray) -> np.ndarray:
        """Codes of `features`: `(n, M)` int32 in `[0, K)`.

        Raises:
            ValueError: if not fitted, or on features of the wrong shape.
        """
        features = check_features("features", features, self._fitted_dim())
        packed = self._compute_codes(features)
        return faiss.unpack_bitstrings(
            packed, self.num_codebooks, self.bits_per_codebook
        ).astype(np.int32)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Reconstructions `x̂(c)` of integer codes, float32 `(n, d)`.

        Raises:
            ValueError: if not fitted, or on codes of the wrong shape or range.
            TypeError: on non-integer codes.
        """
        self._fitted_dim()
        codes = self._check_codes(codes)
        packed = faiss.pack_bitstrings(codes, self.bits_per_codebook)
        return self._decode(packed)

    def asymmetric_scores(
        self, queries: np.ndarray, codes: np.ndarray, chunk_size: int | None = None
    ) -> np.ndarray:
        """ADC scores of real queries against codes, higher is better.

        `score[i, j] = −‖q_i − x̂(c_j)‖²`, computed exactly from per-query
        look-up tables (`M` additions per database item), never from the
        reconstructions.

        Example:

        >>> rng = np.random.default_rng(0)
        >>> features = rng.normal(size=(1000, 16)).astype("float32")
        >>> pq = ProductQuantizer(4, bits_per_subspace=4).fit(features, seed=0)
        >>> scores = pq.asymmetric_scores(features[:3], pq.encode(features))
        >>> scores.shape, bool(np.all(scores <= 0))
        ((3, 1000), True)

        Args:
            queries: `(num_queries, d)` real vectors.
            codes: `(num_database, M)` integer codes from `encode`.
            chunk_size: queries scored at a time (bounds memory); by default
                about 4M scores per chunk.

        Returns:
            float32 `(num_queries, num_database)`.
        """
        queries = check_features("queries", queries, self._fitted_dim())
        codes = self._check_codes(codes)
        if chunk_size is None:
            chunk_size = max(1, _CHUNK_ELEMENTS // max(1, len(codes)))
        chunk_size = check_int("chunk_size", chunk_size, minimum=1)
        scores = np.empty((len(queries), len(codes)), dtype=np.float32)
        if len(codes) == 0:
            return scores
        norms = self._reconstruction_norms(codes)
        for begin in range(0, len(queries), chunk_size):
            rows = slice(begin, begin + chunk_size)
            scores[rows] = self._scores(queries[rows], codes, norms)
        return scores

    # Scorer: asymmetric distance of real queries to codes ----------------

    def encode_database(self, inputs) -> np.ndarray:
        """Codes of database features (`encode`)."""
        return self.encode(inputs)

    def encode_queries(self, inputs) -> np.ndarray:
        """Queries stay real vectors: the distance is asymmetric."""
        return check_features("queries", inputs, self._fitted_dim())

    def score(self, queries: np.ndarray, database: np.ndarray) -> np.ndarray:
        """`asymmetric_scores`: `−‖q − x̂(c)‖²`."""
        return self.asymmetric_scores(queries, database)

    def describe(self) -> dict:
        return {"bits": self.bits, "num_codebooks": self.num_codebooks}

    def _fitted_dim(self) -> int:
        if self.dim is None:
            raise ValueError(
                f"this {type(self).__name__} is not fitted; call fit(features) first"
            )
        return self.dim

    def _check_codes(self, codes) -> np.ndarray:
        codes = np.asarray(codes)
        if codes.dtype.kind not in "iu":
            raise TypeError(f"codes must have an integer dtype, received {codes.dtype}")
        if codes.ndim != 2 or codes.shape[1] != self.num_codebooks:
            raise ValueError(
                f"codes must have shape (n, num_codebooks) = (n, "
                f"{self.num_codebooks}), received shape {codes.shape}"
            )
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError(
                f"codes must lie in [0, {self.codebook_size}), received values in "
                f"[{codes.min()}, {codes.max()}]"
            )
        return codes.astype(np.int32)

    def _check_shape(self, n: int, dim: int) -> None:
        """Raises if the quantizer cannot train on `n` vectors of `dim` values."""

    def _reconstruction_norms(self, codes: np.ndarray) -> np.ndarray | None:
        """Per-code terms the look-up tables leave out (None for PQ)."""
        return None

    @abc.abstractmethod
    def _fit(self, features: np.ndarray, seed: int) -> None: ...

    @abc.abstractmethod
    def _compute_codes(self, features: np.ndarray) -> np.ndarray:
        """faiss's packed codes, uint8 `(n, code_size)`."""

    @abc.abstractmethod
    def _decode(self, packed: np.ndarray) -> np.ndarray: ...

    @abc.abstractmethod
    def _scores(self, queries, codes, norms) -> np.ndarray:
        """`−‖q − x̂(c)‖²` for a chunk of queries against every code."""


class ProductQuantizer(Quantizer):
    """Product quantization (PQ), faiss's `ProductQuantizer`.

    The `d` dimensions are split into `M` contiguous blocks of `d/M`; each
    block is quantized by its own k-means codebook of `K = 2**nbits`
    centroids. The ADC score is
    `−‖q − x̂(c)‖² = −Σ_m ‖q_m − C_m[c_m]‖²`, read from faiss's distance tables
    (`ProductQuantizer.compute_distance_tables`).

    Example:

    >>> rng = np.random.default_rng(0)
    >>> features = rng.normal(size=(4000, 32)).astype("float32")
    >>> pq = ProductQuantizer(num_subspaces=8, bits_per_subspace=4)  # 32 bits
    >>> codes = pq.fit(features, seed=0).encode(features)
    >>> codes.shape, codes.dtype, int(codes.max()) < 16
    ((4000, 8), dtype('int32'), True)
    >>> pq.asymmetric_scores(features[:2], codes).shape
    (2, 4000)

    Args:
        num_subspaces: `M >= 1`, which must divide the feature dimension.
        bits_per_subspace: `nbits` in 1..16.
        num_iterations: k-means iterations per codebook (faiss's default 25).
    """

    def __init__(
        self,
        num_subspaces: int,
        bits_per_subspace: int = 8,
        num_iterations: int = 25,
    ):
        super().__init__(num_subspaces, bits_per_subspace)
        self.num_iterations = check_int("num_iterations", num_iterations, minimum=1)
        self._pq = None

    @property
    def num_subspaces(self) -> int:
        return self.num_codebooks

    def _check_shape(self, n: int, dim: int) -> None:
        if dim % self.num_codebooks:
            raise ValueError(
                f"features must have a dimension divisible by num_subspaces = "
                f"{self.num_codebooks}, received {dim}"
            )

    def _new_pq(self, dim: int, seed: int):
        pq = faiss.ProductQuantizer(dim, self.num_codebooks, self.bits_per_codebook)
        pq.cp.niter = self.num_iterations
        pq.cp.seed = seed
        pq.cp.min_points_per_centroid = 1  # `fit` warns instead.
        return pq

    def _fit(self, features, seed):
        pq = self._new_pq(features.shape[1], seed)
        pq.train(features)
        self._pq = pq

    def _compute_codes(self, features):
        return self._pq.compute_codes(features)

    def _decode(self, packed):
        return self._pq.decode(packed)

    def _scores(self, queries, codes, norms):
        m, k = self.num_codebooks, self.codebook_size
        tables = np.empty((len(queries), m, k), dtype=np.float32)
        self._pq.compute_distance_tables(
            len(queries), faiss.swig_ptr(queries), faiss.swig_ptr(tables)
        )
        return -evaluation.asymmetric_scores(
            tables.reshape(len(queries), m * k), codes, m, k
        )


class OptimizedProductQuantizer(ProductQuantizer):
    """Optimized PQ (OPQ), "Cartesian k-means" (CKM) in the SuBiC paper.

    A rotation `R` (`d × d`, orthonormal) is learned jointly with the PQ
    codebooks by faiss's `OPQMatrix` (alternating PQ training and orthogonal
    Procrustes), then a final PQ is trained on the rotated features with
    `num_iterations` k-means iterations. Since `R` is orthonormal,
    `‖q − Rᵀ x̂_pq‖² = ‖R q − x̂_pq‖²`, so ADC rotates the query and scans PQ
    tables.

    faiss starts the rotation from a random one drawn with its own fixed
    seed (1234); `seed` seeds the k-means.

    Example:

    >>> rng = np.random.default_rng(0)
    >>> features = rng.normal(size=(4000, 32)).astype("float32")
    >>> ckm = OptimizedProductQuantizer(num_subspaces=8, bits_per_subspace=4)
    >>> reconstructed = ckm.fit(features, seed=0).decode(ckm.encode(features))
    >>> reconstructed.shape
    (4000, 32)

    Args:
        num_subspaces: `M >= 1`, which must divide the feature dimension.
        bits_per_subspace: `nbits` in 1..16.
        num_iterations: k-means iterations of the final PQ.
        num_rotation_iterations: alternations of OPQ's training (faiss's
            `OPQMatrix.niter`, default 50).
    """

    def __init__(
        self,
        num_subspaces: int,
        bits_per_subspace: int = 8,
        num_iterations: int = 25,
        num_rotation_iterations: int = 50,
    ):
        super().__init__(num_subspaces, bits_per_subspace, num_iterations)
        self.num_rotation_iterations = check_int(
            "num_rotation_iterations", num_rotation_iterations, minimum=1
        )
        self._rotation = None

    def _check_shape(self, n: int, dim: int) -> None:
        super()._check_shape(n, dim)
        if n < dim:
            # faiss's OPQMatrix corrupts memory (and kills the process) when
            # given fewer training vectors than dimensions.
            raise ValueError(
                f"features must hold at least as many vectors as dimensions ({dim}) "
                f"to fit OPQ's rotation, received {n}"
            )

    def _fit(self, features, seed):
        dim = features.shape[1]
        rotation = faiss.OPQMatrix(dim, self.num_codebooks)
        rotation.niter = self.num_rotation_iterations
        # Without its own PQ, OPQMatrix trains an 8-bit one, which would
        # need 256 training points whatever bits_per_subspace is.
        inner = self._new_pq(dim, seed)
        rotation.pq = inner
        rotation.train(features)
        rotation.pq = None
        self._rotation = rotation
        super()._fit(self._rotate(features), seed)

    def _rotate(self, features):
        return np.ascontiguousarray(self._rotation.apply(features), dtype=np.float32)

    def _compute_codes(self, features):
        return super()._compute_codes(self._rotate(features))

    def _decode(self, packed):
        return self._rotation.reverse_transform(super()._decode(packed))

    def _scores(self, queries, codes, norms):
        return super()._scores(self._rotate(queries), codes, norms)


class LocalSearchQuantizer(Quantizer):
    """Local search quantization (LSQ), faiss's `LocalSearchQuantizer`.

    An additive quantizer: `M` codebooks of `K = 2**nbits` full-dimensional
    codewords, `x̂(c) = Σ_m C_m[c_m]`, with codes found by iterated local
    search (ILS). The ADC score expands the squared distance,

    `−‖q − x̂‖² = 2 Σ_m ⟨q, C_m[c_m]⟩ − ‖q‖² − ‖x̂‖²`,

    with the inner products read from per-query tables (computed in float64
    from faiss's codebooks) and the exact norms `‖x̂‖²` of the database
    reconstructions (faiss's `ST_norm_float` search keeps them beside each
    code).

    LSQ's training and encoding are far slower than PQ's; use small
    `num_iterations` and `encode_ils_iterations` for quick experiments.

    Example:

    >>> rng = np.random.default_rng(0)
    >>> features = rng.normal(size=(1000, 16)).astype("float32")
    >>> lsq = LocalSearchQuantizer(num_codebooks=4, bits_per_codebook=4,
    ...                            num_iterations=2)
    >>> scores = lsq.fit(features, seed=0).asymmetric_scores(
    ...     features[:3], lsq.encode(features))
    >>> scores.shape
    (3, 1000)

    Args:
        num_codebooks: `M >= 1`.
        bits_per_codebook: `nbits` in 1..16.
        num_iterations: training iterations (faiss's `train_iters`, 25).
        encode_ils_iterations: ILS iterations when encoding (faiss's
            `encode_ils_iters`, 16).
        train_ils_iterations: ILS iterations inside training (faiss's
            `train_ils_iters`, 8).
    """

    def __init__(
        self,
        num_codebooks: int,
        bits_per_codebook: int = 8,
        num_iterations: int = 25,
        encode_ils_iterations: int = 16,
        train_ils_iterations: int = 8,
    ):
        super().__init__(num_codebooks, bits_per_codebook)
        self.num_iterations = check_int("num_iterations", num_iterations, minimum=1)
        self.encode_ils_iterations = check_int(
            "encode_ils_iterations", encode_ils_iterations, minimum=1
        )
        self.train_ils_iterations = check_int(
            "train_ils_iterations", train_ils_iterations, minimum=1
        )
        self._lsq = None
        self._codebooks = None

    def _fit(self, features, seed):
        lsq = faiss.LocalSearchQuantizer(
            features.shape[1], self.num_codebooks, self.bits_per_codebook
        )
        lsq.train_iters = self.num_iterations
        lsq.encode_ils_iters = self.encode_ils_iterations
        lsq.train_ils_iters = self.train_ils_iterations
        lsq.random_seed = seed
        lsq.train(features)
        self._lsq = lsq
        self._codebooks = (
            faiss.vector_to_array(lsq.codebooks)
            .reshape(self.num_codebooks, self.codebook_size, -1)
            .astype(np.float64)
        )

    def _compute_codes(self, features):
        return self._lsq.compute_codes(features)

    def _decode(self, packed):
        return self._lsq.decode(packed)

    def _reconstruction_norms(self, codes):
        norms = np.empty(len(codes))
        books = np.arange(self.num_codebooks)
        for begin in range(0, len(codes), 4096):
            chunk = codes[begin : begin + 4096]
            norms[begin : begin + 4096] = np.square(
                self._codebooks[books, chunk].sum(axis=1)
            ).sum(axis=1)
        return norms

    def _scores(self, queries, codes, norms):
        m, k = self.num_codebooks, self.codebook_size
        queries = queries.astype(np.float64)
        inner = queries @ self._codebooks.reshape(m * k, -1).T
        lookup = evaluation.asymmetric_scores(inner, codes, m, k)
        query_norms = np.square(queries).sum(axis=1)
        return 2 * lookup - query_norms[:, None] - norms[None, :]
