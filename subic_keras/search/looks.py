"""What a picture looks like: the second description that orders ties.

SuBiC's codes are trained for classes (paper Sec. 3): a trained model gives
few distinct codes (the 48-bit CIFAR-10 model of `subic train`'s defaults,
27,641 for 60,000 pictures), so a query's best score is shared by a tie
group of tens to thousands of pictures of its class, and a copy of a
picture (cropped, recompressed, mirrored) is one of them. A code cannot
order that group; what the pictures look like can.

A *look* is a picture's thumbnail, `LOOK_SIDE x LOOK_SIDE` in colour (box
averaged from the decoded picture), made mirror-symmetric (the thumbnail
plus its mirror image, of which the left half is kept), centred and scaled
to int8: `LOOK_SIZE` = 96 bytes per item. Similarity is the cosine of two
looks. Chosen by `benchmarks/refine.py` on a validation split against the
soft block probabilities `b̃` and the backbone's feature (random
projection to 64 dimensions, int8): the thumbnail finds the original of an
altered copy more often than either, and costs no forward pass.

`refine` is the ranking: the codes rank first (`M` additions per item), the
best `max(k, SHORTLIST)` of them (and the tie group of the `k`-th, whole,
where it goes on beyond them, up to `MAX_CANDIDATES`) are then ordered:

1. near copies of the query among the codes' best `SHORTLIST` (with their
   tie group), most similar first: those with a look similarity of at
   least `NEAR_COPY`, and the most alike one if it stands out (at least
   `STANDOUT_FLOOR`, and `STANDOUT` more alike than the next: a copy
   altered more than `NEAR_COPY` allows still looks like the query far
   more than pictures that merely share its class);
2. the rest by code score, equal scores by look similarity, then in
   insertion order.

So the ranking of the codes is kept (2.), except that a picture that looks
like the query picture is lifted above pictures that merely share its
class (1.).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import numpy as np

from subic_keras._validation import check_int
from subic_keras.search import native

LOOK_SIDE = 8
LOOK_SIZE = LOOK_SIDE * (LOOK_SIDE // 2) * 3
# Looks of the user's own (`SubicIndex(looks=size)`) are at most this long.
MAX_LOOK_SIZE = 4096
# Chosen on validation (`benchmarks/refine.py`): near copies above it,
# candidates taken from the codes' best `SHORTLIST`, and the margin by which
# one that stands out beats the rest.
NEAR_COPY = 0.9
SHORTLIST = 1000
# The most alike candidate is a near copy too when at least STANDOUT_FLOOR
# alike and STANDOUT more alike than the next (above 1: no such rule).
STANDOUT = 0.05
STANDOUT_FLOOR = 0.6
# The most candidates a query re-ranks (a tie group beyond it keeps the
# codes' order, insertion order, past this many members).
MAX_CANDIDATES = 10_000
_CHUNK = 64  # queries whose candidates are compared at a time


def look(pictures) -> np.ndarray:
    """The looks of uint8 pictures: int8 `(n, LOOK_SIZE)`.

    Example:

    >>> pictures = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), np.uint8)
    >>> looks = look(pictures)
    >>> looks.shape, looks.dtype.name
    ((2, 96), 'int8')
    >>> round(float(similarity(looks[:1], looks)[0, 0]), 4)   # itself
    1.0
    >>> bool(np.array_equal(look(pictures[:, :, ::-1]), looks))   # mirrored
    True

    Args:
        pictures: uint8 `(n, H, W)`, `(n, H, W, 1)` or `(n, H, W, 3)`.

    Raises:
        ValueError: for another dtype or shape.
    """
    from PIL import Image

    pictures = np.asarray(pictures)
    if pictures.ndim == 3:
        pictures = pictures[..., None]
    if (
        pictures.dtype != np.uint8
        or pictures.ndim != 4
        or pictures.shape[-1]
        not in (
            1,
            3,
        )
    ):
        raise ValueError(
            "pictures must be uint8 (n, H, W), (n, H, W, 1) or (n, H, W, 3), "
            f"received {pictures.dtype} {pictures.shape}"
        )
    side = LOOK_SIDE
    thumbs = np.empty((len(pictures), side, side, 3), np.float32)
    for i, picture in enumerate(pictures):
        image = Image.fromarray(picture[..., 0] if picture.shape[-1] == 1 else picture)
        thumbs[i] = np.asarray(
            image.convert("RGB").resize((side, side), Image.Resampling.BOX),
            np.float32,
        )
    # Mirror-symmetric: a mirrored copy has the same look.
    symmetric = (thumbs + thumbs[:, :, ::-1])[:, :, : side // 2]
    flat = symmetric.reshape(len(pictures), -1)
    flat -= flat.mean(axis=1, keepdims=True)
    largest = np.abs(flat).max(axis=1, keepdims=True)
    scaled = flat * (127 / np.maximum(largest, 1e-6))
    return np.rint(scaled).astype(np.int8)


def int8_looks(features, dims: int | None = None, seed: int = 0) -> np.ndarray:
    """Looks of real features `(n, d)` (an embedding of your own, for
    `SubicIndex(looks=dims)`): optionally projected to `dims` dimensions by
    a seeded random orthogonal matrix (which keeps cosines on average),
    then each row scaled so that its largest magnitude is 127, as int8.

    Example:

    >>> features = np.random.default_rng(0).random((3, 1024), dtype=np.float32)
    >>> int8_looks(features, dims=64).shape
    (3, 64)

    Raises:
        ValueError: for features that are not a finite 2-D array, or `dims`
            not in [1, min(d, MAX_LOOK_SIZE)].
    """
    features = np.asarray(features, np.float32)
    if features.ndim != 2 or not np.isfinite(features).all():
        raise ValueError(
            f"features must be a finite (n, d) array, received shape {features.shape}"
        )
    if dims is not None:
        if not isinstance(dims, int) or not 1 <= dims <= min(
            features.shape[1], MAX_LOOK_SIZE
        ):
            raise ValueError(
                f"dims must be in [1, {min(features.shape[1], MAX_LOOK_SIZE)}], "
                f"received {dims!r}"
            )
        gaussian = np.random.default_rng(seed).standard_normal(
            (features.shape[1], dims)
        )
        features = features @ np.linalg.qr(gaussian)[0].astype(np.float32)
    largest = np.abs(features).max(axis=1, keepdims=True)
    return np.rint(features * (127 / np.maximum(largest, 1e-12))).astype(np.int8)


@contextlib.contextmanager
def settings(
    *,
    near_copy: float | None = None,
    shortlist: int | None = None,
    standout: float | None = None,
):
    """Runs searches with other refinement settings, then restores them:
    what `benchmarks/refine.py` chooses `NEAR_COPY`, `SHORTLIST` and
    `STANDOUT` with.

    Args:
        near_copy: the look similarity from which a result is a near copy
            (above 1: no near copies, ties only).
        shortlist: results of the codes that are refined.
        standout: the margin by which the most alike result must beat the
            next to be a near copy (above 1: no such rule).
    """
    global NEAR_COPY, SHORTLIST, STANDOUT
    saved = NEAR_COPY, SHORTLIST, STANDOUT
    if near_copy is not None:
        NEAR_COPY = float(near_copy)
    if shortlist is not None:
        SHORTLIST = check_int("shortlist", shortlist, minimum=1)
    if standout is not None:
        STANDOUT = float(standout)
    try:
        yield
    finally:
        NEAR_COPY, SHORTLIST, STANDOUT = saved


def fitting(looks, size: int):
    """`looks` if they are looks of `size` bytes, else None: the thumbnails
    that a command or the server passes with every query are of no use to
    an index of other looks (or of none), which then ranks by its codes."""
    if looks is None or not size or np.shape(looks)[-1:] != (size,):
        return None
    return looks


def check_look_size(name: str, looks) -> int:
    """The bytes per look an index option asks for: `False` (or 0) none,
    `True` `LOOK_SIZE` (`look`'s), or a count up to `MAX_LOOK_SIZE` (looks
    of the user's own)."""
    if looks is None or isinstance(looks, bool):
        return LOOK_SIZE if looks else 0
    if isinstance(looks, (int, np.integer)) and 0 <= looks <= MAX_LOOK_SIZE:
        return int(looks)
    raise ValueError(
        f"{name} must be True, False or a size in [0, {MAX_LOOK_SIZE}] bytes, "
        f"received {looks!r}"
    )


def check_looks(name: str, looks, n: int, size: int = LOOK_SIZE) -> np.ndarray:
    """`looks` as int8 `(n, size)`, or a ValueError naming `name`."""
    array = np.asarray(looks)
    if array.shape != (n, size) or array.dtype != np.int8:
        raise ValueError(
            f"{name} must be int8 ({n}, {size}), one look per item "
            f"(`subic_keras.search.looks.look`), received {array.dtype} {array.shape}"
        )
    return array


def similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarities of looks `a (na, d)` and `b (nb, d)`: `(na, nb)`."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    norms = np.linalg.norm(a, axis=1)[:, None] * np.linalg.norm(b, axis=1)[None]
    return (a @ b.T) / np.maximum(norms, 1e-6)


@dataclasses.dataclass(frozen=True)
class Candidates:
    """What `refine` reads of the items it orders, by position.

    Attributes:
        count: the items searched (those a filter keeps).
        looks: positions (any shape) to a table of looks `(T, D)` and the
            positions' rows in it (the same shape).
        same_codes: positions to every searched position whose code equals
            one of theirs.
    """

    count: int
    looks: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    same_codes: Callable[[np.ndarray], np.ndarray]


def refine(
    search, items: Candidates, queries: np.ndarray, query_looks: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The refined top `k` of the items searched (module docstring).

    The codes' best `SHORTLIST` of every query are compared with its look
    and ordered in C (`native.refine`: the looks fetched ahead, their dot
    products in AVX2 where the CPU has it, the first `k` kept with a heap),
    or with NumPy a batch of queries at a time where the native scan is not
    built; a query whose `k`-th result ties with the
    shortlist's last (a tie group that goes on beyond the shortlist) gets
    that group whole, up to `MAX_CANDIDATES`.

    Args:
        search: `(queries, k) -> (scores, positions)`, the codes' exact top
            `k` among the items searched (`SubicIndex.view().search`).
        items: the looks and equal codes of the items searched.
        queries: checked float32 queries `(nq, M*K)`.
        query_looks: the queries' looks `(nq, D)`.
        k: results per query, at most `items.count`.

    Returns:
        `(scores, positions)`: the code scores (float32) and positions of
        the `k` results, in the refined order.
    """
    wide = min(items.count, max(k, SHORTLIST))
    scores, positions = search(queries, wide)
    best = _ordered(scores, positions, items, query_looks, k)
    out_scores = np.take_along_axis(scores, best, axis=1).astype(np.float32)
    out_positions = np.take_along_axis(positions, best, axis=1)
    if wide == items.count:
        return out_scores, out_positions
    for row in np.flatnonzero(scores[:, k - 1] == scores[:, -1]):
        # The tie group reaching the top k goes on beyond the shortlist.
        score, position = scores[row], positions[row]
        tied = items.same_codes(position[score == score[-1]])
        tied = _without(tied, position)[: max(0, MAX_CANDIDATES - wide)]
        position = np.concatenate([position, tied])[None]
        score = np.concatenate([score, np.full(len(tied), score[-1])])[None]
        best = _ordered(score, position, items, query_looks[row : row + 1], k)
        out_scores[row] = score[0, best[0]]
        out_positions[row] = position[0, best[0]]
    return out_scores, out_positions


def _without(increasing: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`increasing` (sorted, distinct) without `values`, in order."""
    at = np.searchsorted(increasing, values)
    found = at < len(increasing)
    found[found] = increasing[at[found]] == values[found]
    keep = np.ones(len(increasing), bool)
    keep[at[found]] = False
    return increasing[keep]


def _ordered(scores, positions, items: Candidates, query_looks, k: int) -> np.ndarray:
    """Each row's first `k` candidates in the refined order (`order`), as
    column indices: by the native kernel where it is built, else NumPy a
    batch of queries at a time."""
    table, rows = items.looks(positions)
    bars = scores[:, min(SHORTLIST, scores.shape[1]) - 1]
    if native.kernels():
        return native.refine(
            table, rows, scores, positions, query_looks, bars, k,
            NEAR_COPY, STANDOUT, STANDOUT_FLOOR,
        )  # fmt: skip
    best = np.empty((len(scores), k), np.int64)
    for start in range(0, len(scores), _CHUNK):
        part = slice(start, start + _CHUNK)
        likeness = _likeness(query_looks[part], table[rows[part]])
        eligible = scores[part] >= bars[part, None]
        best[part] = order(scores[part], likeness, positions[part], eligible)[:, :k]
    return best


def _likeness(query_looks: np.ndarray, looks: np.ndarray) -> np.ndarray:
    """Cosines of each query's look `(c, d)` with its candidates' `(c, w, d)`:
    the exact integer dot products and squared norms, then in float32
    `dot / max(|a| |b|, 1e-6)` (what the native kernel computes)."""
    q = query_looks.astype(np.int32)
    items = looks.astype(np.int32)
    dots = np.einsum("cwd,cd->cw", items, q).astype(np.float32)
    item_norms = np.sqrt(np.einsum("cwd,cwd->cw", items, items).astype(np.float32))
    query_norms = np.sqrt(np.einsum("cd,cd->c", q, q).astype(np.float32))
    norms = item_norms * query_norms[:, None]
    return dots / np.maximum(norms, np.float32(1e-6))


def order(
    scores: np.ndarray,
    likeness: np.ndarray,
    positions: np.ndarray,
    eligible: np.ndarray | None = None,
) -> np.ndarray:
    """The refined order of each query's candidates (module docstring).

    Args:
        scores: code scores `(..., c)`.
        likeness: look similarities to the query `(..., c)`.
        positions: insertion positions `(..., c)`, the last tie-break.
        eligible: the candidates that may be near copies (default: all).

    Returns:
        Indices into the candidates along the last axis, best first.
    """
    near = likeness >= NEAR_COPY
    if eligible is not None:
        near &= eligible
    if STANDOUT <= 1 and likeness.shape[-1] >= 2:
        # The one candidate that looks like the query far more than any
        # other is a near copy too (a copy altered more than NEAR_COPY
        # allows stands out from pictures that merely share its class).
        alike = likeness if eligible is None else np.where(eligible, likeness, -2.0)
        top = -np.partition(-alike, 1, axis=-1)[..., :2]
        stands_out = (top[..., 0] >= STANDOUT_FLOOR) & (
            top[..., 0] - top[..., 1] >= STANDOUT
        )
        near |= (alike == top[..., :1]) & stands_out[..., None]
    first = np.where(near, -likeness, -scores.astype(np.float64))
    # np.lexsort sorts by its last key first, along the last axis.
    return np.lexsort((positions, -likeness, first, ~near), axis=-1)
