"""Copy rules applied: which results of a search are copies of its query,
and which stored codes are copies of each other.

An instance code scores an item `x` for a query `q` by the paper's
asymmetric score (Eq. 10), `s(q, x) = sum_m l_m[c_m(x)]`. A result is a
copy when its **copy margin** `m(q, x) = s(q, x) - sum_m max_k l_m[k]`
(`<= 0`; 0: the item's code is the query's own argmax in every block) is
at least the rule's `copy_margin` (`mark`); two stored items are copies
when at least `copy_blocks` of their `M` blocks are equal
(`duplicate_groups`). An exact pixel copy is always one. The rules are
chosen on validation pictures, or on a folder's own, by
`subic_keras.instance.copies` and `subic_keras.instance.folder_rules`.
"""

from __future__ import annotations

import numpy as np

from subic_keras._validation import check_int
from subic_keras.search.subic_index import SubicIndex

# The query kinds an index of an instance code records: FC0's outputs, and
# the block probabilities of indexes written before them.
INSTANCE_QUERIES = ("logits", "z_star")
# The two rules, as a model and an index record them.
COPY_RULES = ("copy_margin", "copy_blocks")


def copy_margins(queries: np.ndarray, scores: np.ndarray, block_size: int):
    """`m = s - sum_m max_k l_m[k]` of each query's scores `(nq, width)`.

    Example:

    >>> copy_margins(np.array([[2.0, 0.0, 1.0, 3.0]]), np.array([[5.0, 2.0]]), 2)
    array([[ 0., -3.]])
    """
    blocks = np.asarray(queries, np.float64).reshape(len(queries), -1, block_size)
    best = blocks.max(-1).sum(-1)
    margins = np.asarray(scores, np.float64) - best[:, None]
    # Scores are the scan's float32 sums: the query's best code may score a
    # hair above or below `best`. Within the sums' rounding every margin is
    # 0, so that all the codes of the query's argmax share one margin.
    rounding = (
        blocks.shape[1] * np.finfo(np.float32).eps * np.abs(blocks).max(-1).sum(-1)
    )
    margins[margins > -rounding[:, None]] = 0.0
    return margins


def mark(
    answers: list[list[dict]],
    queries: np.ndarray,
    block_size: int,
    margin: float | None,
    marked: bool = False,
) -> list[list[dict]]:
    """Adds `"copy"` to every row of `answers` (`Searcher.answer`'s), in
    place.

    `copy`: an exact copy of the query, or a copy margin of at least
    `margin` (`None`: exact copies only, as for a class code); with
    `marked`, the rows' own (an index that keeps instance codes beside
    class codes marks its answers' copies, `search.instance_codes`).

    Example:

    >>> rows = [[{"score": 2.0, "exact": True}, {"score": 1.0, "exact": False}]]
    >>> [r["copy"] for r in mark(rows, np.ones((1, 4)), 2, None)[0]]
    [True, False]

    Returns:
        `answers`.
    """
    if marked:
        return answers
    queries = np.asarray(queries, np.float32)
    for row, query in zip(answers, queries):
        if not row:
            continue
        scores = np.array([match["score"] for match in row])
        margins = copy_margins(query[None], scores[None], block_size)[0]
        for match, value in zip(row, margins):
            near = margin is not None and value >= margin - 1e-6
            match["copy"] = bool(match.get("exact") or near)
    return answers


def recorded_copy_blocks(
    record: dict | None, copy_blocks: int | None, num_blocks: int
) -> int | None:
    """`copy_blocks` (checked against the code's `num_blocks`), or else the
    count an index's model record holds: the one chosen on the folder's
    own pictures (`folder_rules.calibrate_folder`, under `"copies"`; None: none was
    precise enough there, exact copies only), else the model's own.

    Example:

    >>> recorded_copy_blocks({"copies": {"copy_blocks": 61}}, None, 64)
    61

    Raises:
        ValueError: `copy_blocks` is not in [1, num_blocks]; or with none
            given or recorded, saying why: the instance code chose no count
            precise enough, or the index is of a class code.
    """
    if copy_blocks is not None:
        copy_blocks = check_int("copy_blocks", copy_blocks, minimum=1)
        if copy_blocks > num_blocks:
            raise ValueError(
                f"copy_blocks must be at most the code's {num_blocks} blocks, "
                f"received {copy_blocks}"
            )
        return copy_blocks
    record = record or {}
    if isinstance(record.get("copies"), dict):
        value = record["copies"].get("copy_blocks")
        return value if isinstance(value, int) else None
    copy_blocks = record.get("copy_blocks")
    if copy_blocks is None and record.get("query") in INSTANCE_QUERIES:
        raise ValueError(
            "copy_blocks must be given: the instance code that wrote this "
            "index chose no number of equal blocks precise enough on "
            "validation (try 2 or 3 blocks fewer than the code has, or build "
            "the index again to choose one on its own pictures)"
        )
    if copy_blocks is None:
        raise ValueError(
            "copy_blocks must be given for an index whose model chose none "
            "(an index of a class code ranks by class; build one with an "
            "instance code, e.g. `subic index build instance FOLDER`)"
        )
    return copy_blocks


def duplicate_groups(
    codes: np.ndarray,
    ids: np.ndarray,
    block_size: int,
    copy_blocks: int | None,
    k: int = 64,
    *,
    index=None,
    fingerprints: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Groups of stored codes that are copies of each other.

    Each code is searched, one-hot, among all (the native scan: exact, all
    pairs, in C), its `k` best kept; pairs with at least `copy_blocks`
    equal blocks are joined, and the joined pairs' connected components are
    the groups.

    Example:

    >>> codes = np.array([[0, 1, 2], [0, 1, 3], [3, 3, 3], [0, 1, 2]])
    >>> duplicate_groups(codes, np.array([10, 11, 12, 13]), 4, copy_blocks=2)
    [array([10, 11, 13])]

    Args:
        codes: int codes `(n, M)`.
        ids: their ids `(n,)`, distinct.
        block_size: `K`.
        copy_blocks: the least equal blocks of two copies (None: exact
            copies alone, by `fingerprints`).
        k: neighbours looked at per item (a group can be larger: it grows
            through its members' neighbours).
        index: a searcher that holds exactly these ids and codes and scans
            where they are kept (`RayIndex`: each shard scans its own, in
            parallel); default: a `SubicIndex` of them, built here.
        fingerprints: their pixel fingerprints `(n,)` (0: unknown): equal
            ones are joined whatever their codes, exact copies always.

    Returns:
        The groups of two or more ids, each sorted, largest groups first.
    """
    from scipy.sparse import coo_matrix  # type: ignore[import-untyped]
    from scipy.sparse.csgraph import (  # type: ignore[import-untyped]
        connected_components,
    )

    codes = np.asarray(codes)
    ids = np.asarray(ids, np.int64)
    if copy_blocks is not None:
        copy_blocks = check_int("copy_blocks", copy_blocks, minimum=1)
    k = check_int("k", k, minimum=1)
    if len(codes) < 2:
        return []
    num_blocks = codes.shape[1]
    parts = [_exact_pairs(fingerprints, len(codes))]
    # Pairs are joined by the codes' places: the index built here answers
    # in places, a given searcher in ids, mapped back to places.
    sorter = None
    if index is None:
        index = SubicIndex(num_blocks, block_size)
        index.add(codes, ids=np.arange(len(codes)))
    else:
        sorter = np.argsort(ids, kind="stable")
    for start in range(0, len(codes) if copy_blocks else 0, 4096):
        chunk = codes[start : start + 4096]
        equal, found = index.search_codes(chunk, min(k + 1, len(codes)))
        rows, cols = np.nonzero((equal >= copy_blocks) & (found >= 0))
        places = found[rows, cols]
        if sorter is not None:
            places = sorter[np.searchsorted(ids, places, sorter=sorter)]
        parts.append(np.stack([rows + start, places]))
    pairs = np.concatenate(parts, axis=1)
    graph = coo_matrix(
        (np.ones(pairs.shape[1], np.int8), (pairs[0], pairs[1])),
        shape=(len(codes), len(codes)),
    )
    _, labels = connected_components(graph, directed=False)
    # Items by component (one sort, not a pass over all items per group).
    order = np.argsort(labels, kind="stable")
    sizes = np.bincount(labels)
    parts = np.split(ids[order], np.cumsum(sizes)[:-1])
    groups = [np.sort(part) for part in parts if len(part) > 1]
    return sorted(groups, key=lambda group: (-len(group), group[0]))


def _exact_pairs(fingerprints: np.ndarray | None, count: int) -> np.ndarray:
    """Pairs of places `(2, n)` joining pictures of equal, known (non-zero)
    fingerprints: each to the next of its fingerprint."""
    if fingerprints is None:
        return np.zeros((2, 0), np.int64)
    fingerprints = np.asarray(fingerprints, np.uint64)
    if fingerprints.shape != (count,):
        raise ValueError(
            f"fingerprints must hold one per code ({count}), received shape "
            f"{fingerprints.shape}"
        )
    order = np.argsort(fingerprints, kind="stable")
    ordered = fingerprints[order]
    same = np.flatnonzero((ordered[1:] == ordered[:-1]) & (ordered[1:] != 0))
    return np.stack([order[same], order[same + 1]]).astype(np.int64)
