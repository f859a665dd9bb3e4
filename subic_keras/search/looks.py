"""What a picture looks like: the second description that orders ties.

SuBiC's codes are trained for classes (paper Sec. 3): a trained model gives
few distinct codes (the 48-bit CIFAR-10 model of `subic train`'s defaults,
27,641 for 60,000 pictures), so a query's best score is shared by a tie
group of tens to thousands of pictures of its class, and a copy of a
picture (cropped, recompressed, mirrored) is one of them. A code cannot
order that group; what the pictures look like can.

A *look* is what the centre of a picture looks like: the picture is
box-averaged to `WORK_SIDE x WORK_SIDE` and blurred (so that every size
reads alike and a pixel's shift moves little), and its centre, `CENTRE` of
each side, is averaged to `LOOK_SIDE x LOOK_SIDE` in colour, centred and
scaled to int8: `LOOK_SIZE` = 108 bytes per item (`look`). The centre,
because a copy cropped to 64 % of the area or more still holds it whole.
A query is looked at in `VIEWS` = 38 ways (`query_look`): as itself and as
each of 18 crops of its original (sides 0.9 and 0.8 of it, 3 x 3 offsets),
each mirrored and not, each read where the original's centre would lie;
its similarity to an item is the cosine of the most alike view. The views
cost the query, not the index: items keep one look.

Chosen by `benchmarks/refine.py` on a validation split: a query's own look
(one view) against its 38, the soft block probabilities `b̃` and the
backbone's feature (random projection to 64 dimensions, int8). The last
release's look, the whole picture's 8 x 8 thumbnail made mirror-symmetric,
found the original of an altered copy first for 0.833 of the test queries
compared with the whole database; these views find it for 0.993, crops
included.

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
import itertools
from collections.abc import Callable

import numpy as np

from subic_keras._validation import check_int
from subic_keras.search import native

LOOK_SIDE = 6
LOOK_SIZE = LOOK_SIDE * LOOK_SIDE * 3
# Pictures are first box-averaged to WORK_SIDE x WORK_SIDE and blurred
# (Gaussian, BLUR pixels there), so that a look is read alike from a
# picture of any size and a pixel's shift moves it little.
WORK_SIDE = 32
BLUR = 1.0
# An item's look is of its centre, CENTRE of each side: a crop keeping at
# least 64 % of the area (each side at least SCALES[-1]) holds it whole.
CENTRE = 0.6
# A query is looked at as a crop of its original of each side SCALES (1:
# not cropped) at SHIFTS x SHIFTS offsets, mirrored and not: VIEWS looks.
SCALES = (1.0, 0.9, 0.8)
SHIFTS = 3
# Query looks of the user's own (`SubicIndex(looks=size)`) have at most
# this many views.
MAX_VIEWS = 64
# Looks of the user's own (`SubicIndex(looks=size)`) are at most this long.
MAX_LOOK_SIZE = 4096
# Chosen on validation (`benchmarks/refine.py`): near copies above it,
# candidates taken from the codes' best `SHORTLIST`, and the margin by which
# one that stands out beats the rest.
NEAR_COPY = 0.95
SHORTLIST = 3000
# The most alike candidate is a near copy too when at least STANDOUT_FLOOR
# alike and STANDOUT more alike than the next (above 1: no such rule).
STANDOUT = 0.02
STANDOUT_FLOOR = 0.6
# The most candidates a query re-ranks (a tie group beyond it keeps the
# codes' order, insertion order, past this many members).
MAX_CANDIDATES = 10_000
_CHUNK = 64  # queries whose candidates are compared at a time
_BLOCK = 1 << 22  # picture values converted to float at a time
_PICTURES = 1024  # pictures whose looks are computed at a time


def _box(length: int, start: float, stop: float, bins: int) -> np.ndarray:
    """The `(bins, length)` weights that average `[start, stop)` of an axis
    of `length` pixels (pixel `p` covers `[p, p + 1)`) into `bins` equal
    parts, each the covered share of a pixel over the part's width."""
    edges = np.linspace(start, stop, bins + 1)
    pixels = np.arange(length)
    low = np.maximum(edges[:-1, None], pixels[None])
    high = np.minimum(edges[1:, None], pixels[None] + 1)
    return np.maximum(high - low, 0) / ((stop - start) / bins)


def _blur(length: int, sigma: float) -> np.ndarray:
    """A Gaussian blur along an axis as a `(length, length)` matrix, each
    row's weights summing to 1 (so that the edges keep their level)."""
    pixels = np.arange(length)
    weights = np.exp(-0.5 * ((pixels[:, None] - pixels[None]) / sigma) ** 2)
    return weights / weights.sum(axis=1, keepdims=True)


def _windows() -> np.ndarray:
    """Where the original's centre lies in a query, for each crop the
    query may be (`SCALES`, `SHIFTS`): `(windows, 2, 2)` of
    `[[x0, x1], [y0, y1]]`, in fractions of the query's sides. A query that
    is the part `[t, t + s]` of its original along an axis shows the
    original's `u` at `(u - t) / s`."""
    low = (1 - CENTRE) / 2
    out = []
    for scale in SCALES:
        offsets = np.linspace(0, 1 - scale, SHIFTS) if scale < 1 else [0.0]
        for tx, ty in itertools.product(offsets, offsets):
            out.append(
                [[(low - t) / scale, (low + CENTRE - t) / scale] for t in (tx, ty)]
            )
    return np.clip(np.array(out), 0, 1)


VIEWS = 2 * len(_windows())


def _checked(pictures) -> np.ndarray:
    """uint8 pictures as `(n, H, W, C)`, C 1 or 3, or a ValueError."""
    pictures = np.asarray(pictures)
    if pictures.ndim == 3:
        pictures = pictures[..., None]
    if (
        pictures.dtype != np.uint8
        or pictures.ndim != 4
        or pictures.shape[-1] not in (1, 3)
        or 0 in pictures.shape[1:3]
    ):
        raise ValueError(
            "pictures must be uint8 (n, H, W), (n, H, W, 1) or (n, H, W, 3), "
            f"received {pictures.dtype} {pictures.shape}"
        )
    return pictures


def _read(
    pictures, read: Callable[[np.ndarray], np.ndarray], shape: tuple
) -> np.ndarray:
    """`read` of each picture's `_work`, int8 `(n, *shape)`: `_PICTURES`
    pictures at a time, so that the floats stay bounded however many."""
    pictures = _checked(pictures)
    out = np.empty((len(pictures), *shape), np.int8)
    for start in range(0, len(pictures), _PICTURES):
        part = pictures[start : start + _PICTURES]
        out[start : start + _PICTURES] = read(_work(part))
    return out


def _work(pictures: np.ndarray) -> np.ndarray:
    """Checked pictures, box-averaged to `WORK_SIDE` and blurred: float32
    `(n, WORK_SIDE, WORK_SIDE, 3)`."""
    n, height, width, channels = pictures.shape
    blur = _blur(WORK_SIDE, BLUR)
    rows = (blur @ _box(height, 0, height, WORK_SIDE)).astype(np.float32)
    columns = (blur @ _box(width, 0, width, WORK_SIDE)).astype(np.float32)
    # Pictures, and rows of a picture, a block at a time: the float copies
    # stay within _BLOCK values whatever the pictures' size.
    line = width * channels
    per_block = max(1, _BLOCK // (max(height, WORK_SIDE) * line))
    lines = max(1, _BLOCK // line)
    work = np.empty((n, WORK_SIDE, WORK_SIDE, 3), np.float32)
    for start in range(0, n, per_block):
        part = pictures[start : start + per_block]
        reduced = np.zeros((len(part), WORK_SIDE, line), np.float32)
        for top in range(0, height, lines):
            block = part[:, top : top + lines].astype(np.float32)
            reduced += rows[:, top : top + lines] @ block.reshape(len(part), -1, line)
        shaped = reduced.reshape(len(part), WORK_SIDE, width, channels)
        work[start : start + per_block] = columns @ shaped
    return work


def _as_int8(views: np.ndarray) -> np.ndarray:
    """Views `(..., side, side, 3)` flattened, centred and scaled to int8
    (cosines are kept: the largest magnitude of each becomes 127)."""
    flat = views.reshape(*views.shape[:-3], -1)
    flat = flat - flat.mean(axis=-1, keepdims=True)
    largest = np.abs(flat).max(axis=-1, keepdims=True)
    return np.rint(flat * (127 / np.maximum(largest, 1e-6))).astype(np.int8)


def look(pictures) -> np.ndarray:
    """The looks of uint8 pictures, as items keep them: int8 `(n, LOOK_SIZE)`.

    A look is the picture's centre (`CENTRE` of each side), box-averaged to
    `LOOK_SIDE x LOOK_SIDE` in colour from the picture at `WORK_SIDE`
    blurred, centred and scaled to int8.

    Example:

    >>> pictures = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), np.uint8)
    >>> looks = look(pictures)
    >>> looks.shape, looks.dtype.name
    ((2, 108), 'int8')
    >>> round(float(similarity(query_look(pictures[:1]), looks)[0, 0]), 4)
    1.0

    Args:
        pictures: uint8 `(n, H, W)`, `(n, H, W, 1)` or `(n, H, W, 3)`.

    Raises:
        ValueError: for another dtype or shape.
    """
    low = (1 - CENTRE) / 2
    side = _box(WORK_SIDE, low * WORK_SIDE, (low + CENTRE) * WORK_SIDE, LOOK_SIDE)
    side = side.astype(np.float32)

    def centre(work: np.ndarray) -> np.ndarray:
        return _as_int8(np.einsum("iy,nyxc,jx->nijc", side, work, side, optimize=True))

    return _read(pictures, centre, (LOOK_SIZE,))


def query_look(pictures) -> np.ndarray:
    """The looks of query pictures: int8 `(n, VIEWS, LOOK_SIZE)`, one for
    each crop of its original a query may be (`SCALES` x `SHIFTS`
    offsets), mirrored and not: where the original's centre would lie in
    it, read as `look` reads an item. A query's similarity to an item is
    that of its most alike view (`similarity`), so that a crop keeping 64 %
    of a picture's area, or its mirror image, looks like it.

    Example:

    >>> pictures = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), np.uint8)
    >>> query_look(pictures).shape == (2, VIEWS, LOOK_SIZE)
    True
    >>> bool(np.allclose(similarity(query_look(pictures[:, :, ::-1]), look(pictures)),
    ...                  similarity(query_look(pictures), look(pictures)), atol=1e-3))
    True

    Args:
        pictures: uint8 `(n, H, W)`, `(n, H, W, 1)` or `(n, H, W, 3)`.

    Raises:
        ValueError: for another dtype or shape.
    """
    windows = _windows() * WORK_SIDE
    rows = np.stack([_box(WORK_SIDE, w[1, 0], w[1, 1], LOOK_SIDE) for w in windows])
    columns = np.stack([_box(WORK_SIDE, w[0, 0], w[0, 1], LOOK_SIDE) for w in windows])
    rows, columns = rows.astype(np.float32), columns.astype(np.float32)

    def views(work: np.ndarray) -> np.ndarray:
        both = [
            np.einsum("viy,nyxc,vjx->nvijc", rows, picture, columns, optimize=True)
            for picture in (work, work[:, :, ::-1])
        ]
        return _as_int8(np.concatenate(both, axis=1))

    return _read(pictures, views, (VIEWS, LOOK_SIZE))


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
    """`looks` if they are looks of `size` bytes, else None: the query looks
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
    """Cosine similarities of looks `a (na, d)` (or of query views
    `(na, v, d)`: each one's most alike view) and `b (nb, d)`: `(na, nb)`."""
    a = as_views(np.asarray(a, np.float32))
    b = np.asarray(b, np.float32)
    norms = np.linalg.norm(a, axis=2)[:, :, None] * np.linalg.norm(b, axis=1)
    return (np.einsum("avd,bd->avb", a, b) / np.maximum(norms, 1e-6)).max(axis=1)


def as_views(looks: np.ndarray) -> np.ndarray:
    """Query looks `(nq, d)` as `(nq, 1, d)`, views `(nq, v, d)` as they are."""
    return looks[:, None] if looks.ndim == 2 else looks


def check_query_looks(name: str, looks, nq: int, size: int) -> np.ndarray:
    """The queries' looks as int8 views `(nq, v, size)`: `query_look`'s
    `(nq, VIEWS, size)`, or one look a query `(nq, size)` (looks of the
    user's own); else a ValueError naming `name`."""
    array = np.asarray(looks)
    if (
        array.dtype != np.int8
        or array.ndim not in (2, 3)
        or array.shape[0] != nq
        or array.shape[-1] != size
        or (array.ndim == 3 and not 1 <= array.shape[1] <= MAX_VIEWS)
    ):
        raise ValueError(
            f"{name} must be int8 ({nq}, {size}), one look per query, or "
            f"({nq}, views, {size}) with 1 to {MAX_VIEWS} views "
            f"(`subic_keras.search.looks.query_look`), received {array.dtype} "
            f"{array.shape}"
        )
    return as_views(array)


@dataclasses.dataclass(frozen=True)
class Candidates:
    """What `refine` reads of the items it orders, by position.

    Attributes:
        count: the items searched (those a filter keeps).
        looks: positions (any shape) to a table of looks `(T, D)` and the
            positions' rows in it (the same shape).
        same_codes: positions to every searched position whose code equals
            one of theirs.
        dots: the native dot products (`native.refine`); None: the best
            this CPU runs.
    """

    count: int
    looks: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    same_codes: Callable[[np.ndarray], np.ndarray]
    dots: str | None = None


def refine(
    search, items: Candidates, queries: np.ndarray, query_looks: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The refined top `k` of the items searched (module docstring).

    The codes' best `SHORTLIST` of every query are compared with its views
    and ordered in C (`native.refine`: the looks fetched ahead, their dot
    products with AVX-512 VNNI, AVX-512BW or AVX2 where the CPU has them,
    the first `k` kept with a heap),
    or with NumPy a batch of queries at a time where the native scan is not
    built; a query whose `k`-th result ties with the
    shortlist's last (a tie group that goes on beyond the shortlist) gets
    that group whole, up to `MAX_CANDIDATES`.

    Args:
        search: `(queries, k) -> (scores, positions)`, the codes' exact top
            `k` among the items searched (`SubicIndex.view().search`).
        items: the looks and equal codes of the items searched.
        queries: checked float32 queries `(nq, M*K)`.
        query_looks: the queries' views `(nq, v, D)` (`check_query_looks`).
        k: results per query, at most `items.count`.

    Returns:
        `(scores, positions)`: the code scores (float32) and positions of
        the `k` results, in the refined order.
    """
    wide = min(items.count, max(k, SHORTLIST))
    scores, positions = search(queries, wide)
    whole = np.zeros(len(scores), bool)
    if wide < items.count:
        # The tie group reaching the top k goes on beyond the shortlist:
        # those rows are ordered below, with the rest of their group.
        whole = scores[:, k - 1] == scores[:, -1]
    out_scores = np.empty((len(scores), k), np.float32)
    out_positions = np.empty((len(scores), k), np.int64)
    rest = np.flatnonzero(~whole)
    if len(rest):
        some = slice(None) if len(rest) == len(scores) else rest  # no copy
        part_scores, part_positions = scores[some], positions[some]
        best = _ordered(part_scores, part_positions, items, query_looks[some], k)
        out_scores[some] = np.take_along_axis(part_scores, best, axis=1)
        out_positions[some] = np.take_along_axis(part_positions, best, axis=1)
    for row in np.flatnonzero(whole):
        score, position = scores[row], positions[row]
        tied = items.same_codes(position[score == score[-1]])
        tied = without(tied, position)[: max(0, MAX_CANDIDATES - wide)]
        position = np.concatenate([position, tied])[None]
        score = np.concatenate([score, np.full(len(tied), score[-1])])[None]
        best = _ordered(score, position, items, query_looks[row : row + 1], k)
        out_scores[row] = score[0, best[0]]
        out_positions[row] = position[0, best[0]]
    return out_scores, out_positions


def without(increasing: np.ndarray, values: np.ndarray) -> np.ndarray:
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
            NEAR_COPY, STANDOUT, STANDOUT_FLOOR, items.dots,
        )  # fmt: skip
    best = np.empty((len(scores), k), np.int64)
    for start in range(0, len(scores), _CHUNK):
        part = slice(start, start + _CHUNK)
        likeness = _likeness(query_looks[part], table[rows[part]])
        eligible = scores[part] >= bars[part, None]
        best[part] = order(scores[part], likeness, positions[part], eligible)[:, :k]
    return best


def _likeness(query_looks: np.ndarray, looks: np.ndarray) -> np.ndarray:
    """Cosines of each query's views `(c, v, d)` with its candidates'
    looks `(c, w, d)`, the most alike view's, from the exact integer dot
    products and squared norms, in float32 as the native kernel computes
    them: `max_v(dot_v * (1 / |view_v|)) * (1 / |look|)`, 0 for a zero
    norm."""
    q = query_looks.astype(np.int32)
    items = looks.astype(np.int32)
    dots = np.einsum("cwd,cvd->cwv", items, q).astype(np.float32)
    scale = _inverse_norms(np.einsum("cvd,cvd->cv", q, q))
    best = (dots * scale[:, None]).max(axis=2)
    return best * _inverse_norms(np.einsum("cwd,cwd->cw", items, items))


def _inverse_norms(squares: np.ndarray) -> np.ndarray:
    """`1 / sqrt(square)` in float32, 0 where the square is 0."""
    roots = np.sqrt(squares.astype(np.float32))
    with np.errstate(divide="ignore"):
        return np.where(squares > 0, np.float32(1) / roots, np.float32(0))


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
