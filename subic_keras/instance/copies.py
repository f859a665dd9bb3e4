"""What counts as a copy of a picture, for an instance code.

An instance code (`subic_keras.instance.instance_code`) ranks a database by the
asymmetric score of the paper (Eq. 10), `s(q, x) = sum_m l_m[c_m(x)]`,
`l` the query's FC0 outputs (its blocks' log-probabilities up to a
constant per block) and `c(x)` an item's code. Two rules built on it say
which results are copies:

- in a search, a result is a copy of the query when its **copy margin**
  `m(q, x) = s(q, x) - sum_m max_k l_m[k]`, the log-likelihood of the
  item's code against the query's most likely code (`<= 0`; 0: the item's
  code is the query's own argmax in every block), is at least the model's
  `copy_margin` (`mark`);
- among stored codes, two items are copies of each other when at least
  `copy_blocks` of their `M` blocks are equal (`duplicate_groups`): the
  score of a stored code searched as a one-hot query.

`calibrate` chooses both on validation pictures, for a precision: the
share of marked results that are copies, over copies of database pictures
and copies of pictures the database does not hold; and so that neither
marks more than a share of the pictures, unaltered, with a different one.
Both are saved with the model (`InstanceModel`). How a search and the
stored codes apply them (`mark`, `duplicate_groups`) is
`subic_keras.search.copy_rules`'s, whose names this module hands on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from subic_keras._validation import check_int, check_pictures
from subic_keras.search.copy_rules import (
    COPY_RULES,
    INSTANCE_QUERIES,
    copy_margins,
    duplicate_groups,
    mark,
    recorded_copy_blocks,
)
from subic_keras.search.subic_index import SubicIndex

__all__ = [
    "CALIBRATION_K",
    "COPY_RULES",
    "DIFFERENT_SHARE",
    "INSTANCE_QUERIES",
    "PRECISION",
    "STORED_ROWS",
    "calibrate",
    "choose_rules",
    "copy_margin_for",
    "copy_margins",
    "duplicate_groups",
    "least_precise",
    "mark",
    "recorded_copy_blocks",
    "share_above",
]

# The share of marked results that must be copies, on validation.
PRECISION = 0.99
# Results per query whose marks `calibrate` counts.
CALIBRATION_K = 10
# The share of the validation pictures, unaltered, that a rule may mark
# with a different one at most. A picture that repeats among them counts as
# different: where more than this share repeat, the rules come out stricter.
DIFFERENT_SHARE = 0.01
# Stored codes `calibrate` compares with the others, at most (drawn at
# random beyond), and the entries of FC0's outputs it queries at once
# (16 MB).
STORED_ROWS = 10_000
_CHUNK_ENTRIES = 1 << 22


def copy_margin_for(index, code) -> float | None:
    """The copy margin that marks `index`'s copies when searched by `code`:
    the one its record holds (chosen on the folder's own pictures, else the
    model's, `search.instance_codes.copy_margin_of`); for an index that
    records no model (an earlier version's), `code`'s own; None for a
    class code (exact copies only)."""
    from subic_keras.search.instance_codes import copy_margin_of

    record = index.model
    if record is None:
        return getattr(code, "copy_margin", None)
    return copy_margin_of(record)


def least_precise(values: np.ndarray, correct: np.ndarray, precision: float):
    """The smallest threshold `t` among `values` at which the marks
    `values >= t` are `correct` at a rate of at least `precision`, and that
    rate and the share of the correct ones marked; `None` where none is.

    Example:

    >>> least_precise(np.array([0.9, 0.8, 0.7, 0.6]),
    ...               np.array([True, True, False, True]), 0.75)
    (0.6, 0.75, 1.0)
    """
    order = np.argsort(-values, kind="stable")
    values, correct = values[order], correct[order]
    hits = np.cumsum(correct)
    rates = hits / np.arange(1, len(values) + 1)
    # Only the last row of a run of equal values is a threshold of its own.
    last = np.r_[values[1:] != values[:-1], True]
    good = np.flatnonzero(last & (rates >= precision))
    if not len(good):
        return None
    row = good[-1]
    recall = hits[row] / max(1, int(correct.sum()))
    return float(values[row]), float(rates[row]), float(recall)


def calibrate(
    code,
    pictures: np.ndarray,
    *,
    queries: int = 1000,
    precision: float = PRECISION,
    seed: int = 0,
    families: Sequence[str] | None = None,
    batch_size: int = 512,
) -> dict:
    """Chooses `code`'s `copy_margin` and `copy_blocks` on `pictures`.

    The database is every picture but the last `queries`; the queries are
    copies, altered by `families`, of the first `queries` pictures (whose
    originals the database holds) and of the last `queries` (whose it does
    not). Over each query's `CALIBRATION_K` best results, the least
    threshold whose marks are copies at a rate of `precision` is kept,
    for the copy margin and for equal blocks alike, and set on
    `code.model` (saved with it); where no threshold is that precise, the
    rule is `None` (only exact copies are marked, no duplicates listed).

    Neither rule is below what marks more than `DIFFERENT_SHARE` of the
    pictures, unaltered, with another one: each picture's best copy margin
    and most equal blocks among all the others' codes (of `STORED_ROWS`
    pictures drawn at random, where there are more), as the rules meet
    different pictures in use. An unaltered picture's code is surer than an
    altered copy's, and two different pictures can share more blocks than a
    copy and a picture it is not: chosen on altered copies alone, the rules
    grouped different pictures of a small folder as duplicates
    (docs/instance.md, "What counts as a copy").

    Args:
        code: an `InstanceSubic`.
        pictures: uint8 validation pictures `(n, H, W[, C])`, more than
            `2 · queries`.
        queries: copies of database pictures, and as many of others.
        precision: the least share of marked results that are copies.
        seed: the alterations' seed.
        families: the alteration families of the copies (default: all).
        batch_size: prediction batch size.

    Returns:
        What was chosen and measured: `copy_margin`, `copy_blocks`, and
        for each the precision and recall (share of copies' originals
        marked) on the validation queries, its `floor` (the least value
        `DIFFERENT_SHARE` allows), and under `"best"` the most precise
        threshold and its precision and recall, whatever the target and
        the floor.
    """
    from subic_keras.instance import alterations

    pictures = check_pictures("pictures", pictures)
    queries = check_int("queries", queries, minimum=1)
    if len(pictures) <= 2 * queries:
        raise ValueError(
            f"pictures must number more than 2 · queries = {2 * queries}, "
            f"received {len(pictures)}"
        )
    if not 0 < precision <= 1:
        raise ValueError(f"precision must be in (0, 1], received {precision}")
    database = pictures[:-queries]
    asked = np.concatenate([pictures[:queries], pictures[-queries:]])
    families = alterations.FAMILIES if families is None else families
    copies = alterations.alter_batch(asked, seed=seed, families=families)
    index = SubicIndex(code.num_blocks, code.block_size)
    index.add(code.encode(database, batch_size))
    truth = np.r_[np.arange(queries), np.full(queries, -1)][:, None]
    k = min(CALIBRATION_K, len(database))

    # Queries: the copies, then the pictures the database lacks, unaltered.
    queried = code.query(np.concatenate([copies, pictures[-queries:]]), batch_size)
    scores, ids = index.search(queried, k)
    margins = copy_margins(queried, scores, code.block_size)
    n = len(copies)
    scored = margins[:n].ravel(), (ids[:n] == truth).ravel()

    # The copies' own codes, from the outputs already at hand: a block's
    # argmax is its probabilities' (`InstanceSubic.encode`).
    blocks_of = code.num_blocks, code.block_size
    own = queried[:n].reshape(n, *blocks_of).argmax(-1)
    equal, ids = index.search_codes(own, k)
    blocks = equal.ravel(), (ids == truth).ravel()

    floors = _floors(code, index, database, queried[n:], seed, batch_size)

    result = choose_rules(scored, blocks, floors, precision)
    result["queries"] = 2 * queries
    for name in COPY_RULES:
        setattr(code.model, name, result[name]["value"])
    return result


def _floors(code, index, database, lacking, seed, batch_size) -> dict:
    """The least value of each rule that different pictures do not reach
    in more than `DIFFERENT_SHARE` of cases; `lacking`: FC0's outputs of
    the pictures the database lacks, unaltered."""
    blocks_of = code.num_blocks, code.block_size
    # Different pictures, as each rule meets them in use: unaltered, each
    # picture's best margin and most equal blocks among the others' codes.
    every = SubicIndex(*blocks_of)
    every.add(index.get_codes())
    every.add(lacking.reshape(len(lacking), *blocks_of).argmax(-1))
    rows = np.arange(len(every))
    if len(rows) > STORED_ROWS:
        rows = np.sort(
            np.random.default_rng(seed).choice(len(rows), STORED_ROWS, False)
        )
    equal_blocks = share_above(
        _best_other(*every.search_codes(every.get_codes(rows), 2), rows)
    )
    other_margins = []
    chunk = max(1, _CHUNK_ENTRIES // (code.num_blocks * code.block_size))
    for start in range(0, len(rows), chunk):
        part = rows[start : start + chunk]
        # FC0's outputs: the database's computed now, those of the pictures
        # it lacks at hand (rows are sorted: the database's come first).
        stored = part < len(database)
        fc0 = np.concatenate(
            [
                code.query(database[part[stored]], batch_size),
                lacking[part[~stored] - len(database)],
            ]
        )
        best = _best_other(*every.search(fc0, 2), part)
        other_margins.append(copy_margins(fc0, best[:, None], code.block_size)[:, 0])
    margin = share_above(np.concatenate(other_margins))
    # Strictly above what the share of pictures reach: the next margin of
    # 6 decimals (as saved), the next count of blocks.
    return {
        "copy_margin": np.floor(margin * 1e6 + 1) / 1e6,
        "copy_blocks": equal_blocks + 1,
    }


def choose_rules(scored, blocks, floors: dict, precision: float) -> dict:
    """Each rule's least threshold from its floor up whose marks are
    `correct` at a rate of `precision` (None where none is), with that
    rate, its recall (the share of the correct results marked) and the
    most precise threshold whatever the target (`"best"`).

    Args:
        scored: `(margins, correct)` of the copies' results, flat.
        blocks: `(equal blocks, correct)` of the same results.
        floors: the least value of each rule (`COPY_RULES`) that different
            pictures allow.
        precision: the least share of marked results that are copies.
    """
    result: dict = {"precision_target": precision, "different_share": DIFFERENT_SHARE}
    for name, value, (values, correct) in (
        ("copy_margin", lambda t: round(t, 6), scored),
        ("copy_blocks", round, blocks),
    ):
        above = values >= floors[name]
        found = least_precise(values[above], correct[above], precision)
        if found is not None:  # recall: of every copy, not those above
            hits = int(correct[above].sum())
            found = (*found[:2], found[2] * hits / max(1, int(correct.sum())))
        if found is None:  # never precise enough: no rule, exact copies only
            result[name] = {"value": None, "precision": None, "recall": 0.0}
        else:
            result[name] = {
                "value": value(found[0]),
                "precision": found[1],
                "recall": found[2],
            }
        result[name]["floor"] = float(floors[name])
        best = least_precise(values, correct, _best_rate(values, correct))
        if best is not None:
            result[name]["best"] = dict(zip(("value", "precision", "recall"), best))
    return result


def share_above(values: np.ndarray, share: float = DIFFERENT_SHARE) -> float:
    """The least of `values` that at most `share` of them exceed."""
    if not len(values):
        return -np.inf
    return float(np.quantile(values, 1 - share, method="higher"))


def _best_other(scores: np.ndarray, found: np.ndarray, rows: np.ndarray):
    """Each row's best score of an item other than its own (`rows`), from a
    search of 2 results: its item is among them unless another shares its
    code and comes first, both scoring alike; then the last goes instead."""
    itself = found == rows[:, None]
    itself[~itself.any(axis=1), -1] = True
    return scores[~itself].reshape(len(rows), -1)[:, 0]


def _best_rate(values: np.ndarray, correct: np.ndarray) -> float:
    """The highest rate of correct marks of any threshold among `values`."""
    order = np.argsort(-values, kind="stable")
    values, correct = values[order], correct[order]
    rates = np.cumsum(correct) / np.arange(1, len(values) + 1)
    last = np.r_[values[1:] != values[:-1], True]
    return float(rates[last].max()) if len(values) else 1.0
