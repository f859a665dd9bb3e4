"""Views of a picture: crops of it, indexed or searched as that picture.

An instance code at 32 × 32 sees a crop at another offset as another
picture. Database-side views index a few crops of each picture beside it
(`crop_boxes`, `picture_views`), so that a cropped copy can meet the crop
nearest it; query-side views search a few views of a query and keep each
picture's best. Either way the answers are pictures, each once, by its best
view (`by_picture`). Query views are compared by their copy margins
(`copy_rules.copy_margins`: a score less the best the view could reach),
since each view's scores have a scale of their own.

A picture's crops are also distractors for copies of other pictures. A
gate keeps them from outranking the pictures themselves by less than
`gate` (`gated`), chosen on a folder's own altered copies, no labels
(`choose_gate`). `ViewIndex` holds both codes and searches them so.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from subic_keras._validation import check_int, check_non_negative, check_pictures
from subic_keras.search.copy_rules import copy_margins
from subic_keras.search.subic_index import SubicIndex

# The gates `choose_gate` tries: margins are sums over blocks of
# log-probabilities less their best, tens to hundreds apart at 64 blocks.
GATES = tuple(range(0, 201, 10))

# The side of the crops `crop_boxes` cuts, as a share of the picture's: the
# crop family keeps 0.63 to 1 of each side (area 0.4 to 1), 0.82 on average.
VIEW_SIDE = 0.8


def crop_boxes(side: float = VIEW_SIDE, corners: bool = True) -> np.ndarray:
    """The whole picture, its centre crop and (with `corners`) its four
    corner crops of `side`, as `(top, left, bottom, right)` fractions.

    Example:

    >>> crop_boxes(0.8, corners=False)
    array([[0. , 0. , 1. , 1. ],
           [0.1, 0.1, 0.9, 0.9]], dtype=float32)

    Args:
        side: the crops' side, a share of the picture's in (0, 1).
        corners: whether the four corner crops are views too.

    Returns:
        float32 `(V, 4)`: 2 views, or 6 with the corners.
    """
    if not 0 < side < 1:
        raise ValueError(f"side must be in (0, 1), received {side}")
    margin = (1 - side) / 2
    boxes = [(0, 0, 1, 1), (margin, margin, 1 - margin, 1 - margin)]
    if corners:
        rest = 1 - side
        boxes += [(top, left, top + side, left + side) for top in (0, rest)
                  for left in (0, rest)]  # fmt: skip
    return np.array(boxes, np.float32)


def picture_views(pictures: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Each picture's views: the part in each box, resized back to the
    picture's size (bilinear, as the crop family resizes).

    Example:

    >>> pictures = np.zeros((3, 32, 32, 3), np.uint8)
    >>> picture_views(pictures, crop_boxes()).shape
    (18, 32, 32, 3)

    Args:
        pictures: uint8 `(n, H, W[, C])`.
        boxes: `(V, 4)` fractions, as `crop_boxes` gives them.

    Returns:
        uint8 `(n * V, H, W[, C])`: picture `i`'s views at rows `i * V` to
        `i * V + V - 1`, in the order of `boxes`.
    """
    import tensorflow as tf

    pictures = check_pictures("pictures", pictures)
    boxes = np.asarray(boxes, np.float32)
    if boxes.ndim != 2 or boxes.shape[1] != 4 or not len(boxes):
        raise ValueError(f"boxes must have shape (V, 4), received {boxes.shape}")
    # `crop_and_resize` fills a sample past the last pixel with 0, and a box
    # ending at 1 can land a rounding step past it: the edge, a hair inside.
    boxes = np.minimum(boxes, np.float32(1 - 1e-6))
    grey = pictures.ndim == 3
    images = pictures[..., None] if grey else pictures
    size = images.shape[1:3]
    parts = []
    for start in range(0, len(images), 1024):
        chunk = images[start : start + 1024]
        which = np.repeat(np.arange(len(chunk), dtype=np.int32), len(boxes))
        cut = tf.image.crop_and_resize(
            tf.constant(chunk, tf.float32), np.tile(boxes, (len(chunk), 1)), which,
            size,
        )  # fmt: skip
        parts.append(np.clip(np.rint(cut.numpy()), 0, 255).astype(np.uint8))
    views = np.concatenate(parts) if parts else np.zeros_like(images[:0])
    return views[..., 0] if grey else views


def by_picture(
    values: np.ndarray, pictures: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The `k` best pictures of each row of results, each picture once, by
    its best view: `values[i, j]` is how good result `j` of query `i` is,
    `pictures[i, j]` the picture that result is a view of.

    Example:

    >>> by_picture(np.array([[5.0, 4.0, 3.0, 2.0]]), np.array([[7, 7, 2, 9]]), 2)
    (array([[5., 3.]]), array([[7, 2]]))

    Args:
        values: `(n, m)` scores or margins, higher better.
        pictures: `(n, m)` int ids of the pictures the results show
            (negative: no result).
        k: pictures kept per row, >= 1.

    Returns:
        `(values, pictures)`, each `(n, k)`, best first; rows with fewer
        than `k` pictures end in `-inf` and `-1`.
    """
    k = check_int("k", k, minimum=1)
    values = np.asarray(values, np.float64)
    pictures = np.asarray(pictures, np.int64)
    if values.shape != pictures.shape or values.ndim != 2:
        raise ValueError(
            f"values and pictures must have one shape (n, m), received "
            f"{values.shape} and {pictures.shape}"
        )
    best = np.full((len(values), k), -np.inf)
    found = np.full((len(values), k), -1, np.int64)
    order = np.argsort(-values, axis=1, kind="stable")
    for row, ranked in enumerate(order):
        shown = pictures[row, ranked]
        real = shown >= 0
        _, first = np.unique(shown[real], return_index=True)
        kept = ranked[real][np.sort(first)][:k]
        best[row, : len(kept)] = values[row, kept]
        found[row, : len(kept)] = pictures[row, kept]
    return best, found


def gated(
    pictures: tuple[np.ndarray, np.ndarray],
    views: tuple[np.ndarray, np.ndarray],
    gate: float,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Answers by picture from the pictures' own codes and their crops'
    codes, a crop's margin lowered by `gate`: `max(m_picture, m_crop - gate)`
    for each picture, the `k` best.

    Example:

    >>> own = (np.array([[-30.0, -50.0]]), np.array([[4, 9]]))
    >>> crops = (np.array([[-10.0]]), np.array([[9]]))
    >>> gated(own, crops, 10.0, 2)[1], gated(own, crops, 40.0, 2)[1]
    (array([[9, 4]]), array([[4, 9]]))

    Args:
        pictures: `(margins, ids)` `(n, m)` of the search among the
            pictures' own codes.
        views: `(margins, pictures)` `(n, m')` of the search among their
            crops' codes, each result's picture id.
        gate: how much a crop's margin is lowered, >= 0.
        k: pictures kept per query.

    Returns:
        `(values, ids)`, each `(n, k)`, as `by_picture`.
    """
    gate = check_non_negative("gate", gate)
    values = np.concatenate([pictures[0], np.asarray(views[0]) - gate], axis=1)
    return by_picture(values, np.concatenate([pictures[1], views[1]], axis=1), k)


def choose_gate(
    pictures: tuple[np.ndarray, np.ndarray],
    views: tuple[np.ndarray, np.ndarray],
    originals: np.ndarray,
    gates: Sequence[float] = GATES,
) -> tuple[float, dict]:
    """The gate under which altered copies of a folder's own pictures find
    their originals first most often (the largest of equals: crops win the
    least that they need).

    Example:

    >>> own = (np.array([[-30.0], [-5.0]]), np.array([[4], [2]]))
    >>> crops = (np.array([[-10.0], [-3.0]]), np.array([[9], [8]]))
    >>> choose_gate(own, crops, np.array([9, 2]), gates=(0, 10, 30))
    (10, {0: 0.5, 10: 1.0, 30: 0.5})

    Args:
        pictures, views: the copies' searches, as `gated` takes them.
        originals: `(n,)` the picture each copy was made from.
        gates: the gates tried.

    Returns:
        `(gate, {gate: recall@1})`.
    """
    originals = np.asarray(originals, np.int64)
    recall = {
        gate: float(np.mean(gated(pictures, views, gate, 1)[1][:, 0] == originals))
        for gate in gates
    }
    best = max(recall.values())
    return max(gate for gate, value in recall.items() if value == best), recall


def encode_views(
    code, pictures: np.ndarray, boxes: np.ndarray | None = None, batch_size: int = 512
) -> np.ndarray:
    """The instance codes of each picture's views, `(n, V, M)`: `boxes`
    (default `crop_boxes()`, the picture first) cut by `picture_views`, a
    few thousand pictures at a time.

    Example:

    >>> codes = encode_views(code, pictures)  # doctest: +SKIP
    >>> codes.shape  # doctest: +SKIP
    (1000, 6, 64)
    """
    boxes = crop_boxes() if boxes is None else np.asarray(boxes, np.float32)
    pictures = check_pictures("pictures", pictures)
    parts = [np.zeros((0, len(boxes), code.num_blocks), np.int32)]
    for start in range(0, len(pictures), 5000):
        views = picture_views(pictures[start : start + 5000], boxes)
        codes = code.encode(views, batch_size)
        parts.append(codes.reshape(-1, len(boxes), code.num_blocks))
    return np.concatenate(parts)


class ViewIndex:
    """Pictures searched by their own codes and their crops' codes, each
    picture answered once (`gated`).

    Example:

    >>> index = ViewIndex(code.num_blocks, code.block_size)  # doctest: +SKIP
    >>> index.add(encode_views(code, pictures))  # doctest: +SKIP
    >>> copies = alterations.alter_batch(pictures[:2000], seed=1)  # doctest: +SKIP
    >>> index.choose_gate(code.query(copies), np.arange(2000))  # doctest: +SKIP
    120
    >>> margins, ids = index.search(code.query(queries), 10)  # doctest: +SKIP

    Args:
        num_blocks: `M`, the code's blocks.
        block_size: `K`, the size of each block.
        gate: how much a crop's copy margin is lowered (default 0: crops
            compete as pictures; `choose_gate` sets one).
    """

    def __init__(self, num_blocks: int, block_size: int, gate: float = 0.0):
        self.num_blocks = check_int("num_blocks", num_blocks, minimum=1)
        self.block_size = check_int("block_size", block_size, minimum=2)
        self._own = SubicIndex(self.num_blocks, self.block_size)
        self._crops = SubicIndex(self.num_blocks, self.block_size)
        self._views = 0
        self.gate = check_non_negative("gate", gate)
        # `{gate: recall@1}` of the copies `choose_gate` chose on.
        self.gates_tried: dict | None = None

    def __len__(self) -> int:
        return len(self._own)

    def add(self, codes: np.ndarray) -> np.ndarray:
        """Adds pictures by their views' codes `(n, V, M)` (the picture's own
        first, as `encode_views` gives them); returns their ids, in order
        from 0.

        Raises:
            ValueError: for codes of another shape, or of another number of
                views than those added before.
        """
        codes = np.asarray(codes)
        if codes.ndim != 3 or codes.shape[1] < 2 or codes.shape[2] != self.num_blocks:
            raise ValueError(
                f"codes must have shape (n, V >= 2, {self.num_blocks}), received "
                f"{codes.shape}"
            )
        if self._views and codes.shape[1] != self._views:
            raise ValueError(
                f"codes must have {self._views} views as those added before, "
                f"received {codes.shape[1]}"
            )
        self._views = codes.shape[1]
        ids = self._own.add(codes[:, 0])
        self._crops.add(codes[:, 1:].reshape(-1, self.num_blocks))
        return ids

    def candidates(self, queries: np.ndarray, k: int) -> tuple[tuple, tuple]:
        """What `gated` merges: `(margins, ids)` of the `k` best pictures by
        their own codes, and `(margins, pictures)` of the best `k` crops per
        crop view (picture ids), for float queries `(n, M * K)`."""
        queries = np.asarray(queries, np.float32)
        k = check_int("k", k, minimum=1)
        scores, ids = self._own.search(queries, min(k, len(self)))
        own = (copy_margins(queries, scores, self.block_size), ids)
        crops = self._views - 1
        scores, ids = self._crops.search(queries, min(crops * k, len(self._crops)))
        margins = copy_margins(queries, scores, self.block_size)
        return own, (margins, np.where(ids >= 0, ids // crops, -1))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The `k` best pictures of each query, `(margins, ids)`, by
        `max(m_picture, m_crop - gate)`.

        Raises:
            ValueError: for an empty index.
        """
        if not len(self):
            raise ValueError("the index holds no picture to search")
        return gated(*self.candidates(queries, k), self.gate, k)

    def choose_gate(
        self, copies: np.ndarray, originals: np.ndarray, gates: Sequence[float] = GATES
    ) -> float:
        """Sets `gate` to the one under which the queries `copies` (altered
        copies of pictures the index holds, no labels needed) find their
        `originals` (ids) first most often (`choose_gate`); returns it."""
        if not len(self):
            raise ValueError("the index holds no picture to choose a gate on")
        originals = np.asarray(originals)
        if originals.shape != (len(copies),):
            raise ValueError(
                f"originals must hold one id per copy, shape ({len(copies)},), "
                f"received {originals.shape}"
            )
        self.gate, self.gates_tried = choose_gate(
            *self.candidates(copies, 1), originals, gates
        )
        return self.gate
