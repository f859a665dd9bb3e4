"""Retrieval protocols and reproducible splits, in NumPy only.

A protocol splits a labelled test set into queries and database. The
paper's CIFAR-10 protocol (Sec. 4.1, following DSH) draws 100 queries per
class, 1,000 in all, and uses the other 9,000 test images as the database;
`RETRIEVAL_PROTOCOLS` names it and the other splits the package evaluates.
`train_validation_split` holds out the validation split that model selection
uses.

Splits are drawn with `np.random.default_rng(seed)`, so the same seed gives
the same split on every machine.
"""

from __future__ import annotations

import dataclasses
import numbers

import numpy as np

from subic_keras._validation import check_int


@dataclasses.dataclass(frozen=True)
class RetrievalProtocol:
    """A named query/database split of a labelled test set."""

    name: str
    description: str


RETRIEVAL_PROTOCOLS = {
    p.name: p
    for p in (
        RetrievalProtocol(
            "paper",
            "SuBiC/DSH-paper CIFAR-10 split: 100 random queries per class "
            "(1,000), the rest of the test set (9,000) as database.",
        ),
        RetrievalProtocol(
            "dsh",
            "DSH's own protocol: every test image is a query against the whole "
            "test set, itself included.",
        ),
        RetrievalProtocol(
            "random",
            "Seeded random queries, num_queries in total or queries_per_class "
            "per class; the rest is the database.",
        ),
        RetrievalProtocol(
            "unseen",
            "Classes held out of training only (Sablayrolles et al., ICASSP "
            "2017): 100 random queries per held-out class (queries_per_class), "
            "the rest of those classes' test items as database.",
        ),
    )
}
# The share of a dataset's classes an unseen-class split holds out of
# training (rounded up: 3 of CIFAR-10's 10).
UNSEEN_FRACTION = 0.25


def held_out_classes(num_classes: int, split: int = 0) -> tuple[int, ...]:
    """The classes unseen-class split `split` holds out of training.

    Sablayrolles, Douze, Usunier and Jégou ("How should we evaluate
    supervised hashing?", ICASSP 2017) train on about 75 % of the classes
    and retrieve among the others, where a classifier's prediction cannot
    stand in for a code. Here `ceil(num_classes / 4)` classes are held out:
    the classes in a fixed order (a permutation drawn with seed 0), split
    `s` takes its `s`-th run, so the splits hold out disjoint classes.

    Example:

    >>> [held_out_classes(10, split) for split in range(3)]
    [(2, 4, 6), (3, 5, 7), (0, 8, 9)]

    Args:
        num_classes: the dataset's classes, at least 2.
        split: which split, in `[0, num_classes // ceil(num_classes / 4))`.

    Returns:
        The held-out class ids, sorted.
    """
    num_classes = check_int("num_classes", num_classes, minimum=2)
    count = -(-num_classes // 4)
    splits = num_classes // count
    split = check_int("split", split, minimum=0)
    if split >= splits:
        raise ValueError(
            f"split must be < {splits} (the number of unseen-class splits of "
            f"{num_classes} classes), received {split}"
        )
    order = np.random.default_rng(0).permutation(num_classes)
    return tuple(sorted(int(c) for c in order[split * count : (split + 1) * count]))


def protocol_split(
    name: str,
    labels: np.ndarray,
    seed: int = 0,
    num_queries: int | None = None,
    queries_per_class: int | None = None,
    classes=None,
) -> tuple[np.ndarray, np.ndarray]:
    """Query and database indices of a named protocol (`RETRIEVAL_PROTOCOLS`).

    Example:

    >>> labels = np.repeat(np.arange(10), 1000)
    >>> queries, database = protocol_split("paper", labels)
    >>> len(queries), len(database)
    (1000, 9000)

    Args:
        name: `"paper"`, `"dsh"` or `"random"`.
        labels: `(n,)` class ids of the test set; `(n, C)` multi-hot labels
            are accepted by `"dsh"` and by `"random"` with `num_queries`.
        seed: seed of the random choice of queries (`"paper"`, `"random"`).
        num_queries: total queries for `"random"`.
        queries_per_class: queries per class for `"random"`; exactly one of
            `num_queries` and `queries_per_class` must be given for it. For
            `"unseen"`, 100 by default.
        classes: for `"unseen"` (and only it), the classes held out of
            training (`held_out_classes`): queries and database are drawn
            from their items alone.

    Returns:
        `(query_indices, database_indices)`, sorted int64 arrays. For
        `"dsh"` both are `arange(n)`.

    Raises:
        ValueError: on an unknown name, or query counts given to a protocol
            that fixes them, or not exactly one given to `"random"`.
    """
    if not isinstance(name, str) or name not in RETRIEVAL_PROTOCOLS:
        raise ValueError(
            f"name must be one of {tuple(RETRIEVAL_PROTOCOLS)}, received {name!r}"
        )
    seed = check_int("seed", seed, minimum=0)
    labels = _check_labels(labels)
    if (classes is None) != (name != "unseen"):
        raise ValueError(
            "classes (the held-out classes) goes with protocol 'unseen' and only "
            f"with it, received protocol {name!r} and classes {classes!r}"
        )
    if name == "unseen":
        return _unseen_split(labels, classes, seed, num_queries, queries_per_class)
    if name == "paper" and labels.ndim != 1:
        raise ValueError(
            "protocol 'paper' draws queries per class, so labels must be class "
            f"ids of shape (n,), received shape {labels.shape}"
        )
    if name in ("paper", "dsh") and (
        num_queries is not None or queries_per_class is not None
    ):
        raise ValueError(
            f"protocol {name!r} fixes its queries: num_queries and "
            f"queries_per_class must be None, received {num_queries!r} and "
            f"{queries_per_class!r} (use 'random' to choose them)"
        )
    if name == "dsh":
        everything = np.arange(len(labels), dtype=np.int64)
        return everything, everything.copy()

    if name == "paper":
        return query_database_split(labels, queries_per_class=100, seed=seed)
    if (num_queries is None) == (queries_per_class is None):
        raise ValueError(
            "protocol 'random' needs exactly one of num_queries and "
            f"queries_per_class, received {num_queries!r} and {queries_per_class!r}"
        )
    return query_database_split(
        labels,
        queries_per_class=queries_per_class,
        num_queries=num_queries,
        seed=seed,
    )


def _unseen_split(labels, classes, seed, num_queries, queries_per_class):
    if labels.ndim != 1:
        raise ValueError(
            "protocol 'unseen' holds out classes, so labels must be class ids of "
            f"shape (n,), received shape {labels.shape}"
        )
    if num_queries is not None:
        raise ValueError(
            "protocol 'unseen' draws queries per class: give queries_per_class, "
            f"received num_queries={num_queries!r}"
        )
    held = np.unique(np.asarray(classes))
    if not held.size or held.ndim != 1 or not np.isin(held, labels).all():
        raise ValueError(
            f"classes must name classes of labels, received {list(held)[:20]} "
            f"(labels hold {np.unique(labels)[:20].tolist()})"
        )
    kept = np.flatnonzero(np.isin(labels, held))
    queries, database = query_database_split(
        labels[kept], queries_per_class or 100, seed=seed
    )
    return kept[queries], kept[database]


def query_database_split(
    labels: np.ndarray,
    queries_per_class: int | None = 100,
    num_queries: int | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Splits a labelled set into queries and database, reproducibly.

    With `num_queries`, that many queries are drawn uniformly without
    replacement (labels may be multi-hot, 2-D); otherwise
    `queries_per_class` are drawn from every class (1-D class ids). The rest
    is the database. CIFAR-10 protocol: `queries_per_class=100` on the test set.

    Example:

    >>> y_test = np.repeat(np.arange(10), 1000)   # CIFAR-10's test labels
    >>> queries, database = query_database_split(y_test, queries_per_class=100)
    >>> len(queries), len(database)
    (1000, 9000)

    Args:
        labels: `(n,)` class ids, or `(n, C)` multi-hot with `num_queries`.
        queries_per_class: queries per class; used when `num_queries` is None.
        num_queries: total number of queries, in [1, n - 1]; takes precedence.
        seed: seed of `np.random.default_rng`.

    Returns:
        `(query_indices, database_indices)`: sorted int64, disjoint, together
        covering `range(n)`.

    Raises:
        ValueError: both counts None, counts out of range, or a class with fewer
            than `queries_per_class` items (named with its count).
    """
    labels = _check_labels(labels)
    seed = check_int("seed", seed, minimum=0)
    n = labels.shape[0]
    rng = np.random.default_rng(seed)
    if num_queries is not None:
        num_queries = check_int("num_queries", num_queries, minimum=1)
        if num_queries >= n:
            raise ValueError(
                f"num_queries must be < the number of items ({n}) so that the "
                f"database is not empty, received {num_queries}"
            )
        queries = rng.choice(n, size=num_queries, replace=False)
    elif queries_per_class is None:
        raise ValueError(
            "one of queries_per_class and num_queries must be given, received both None"
        )
    else:
        queries_per_class = check_int("queries_per_class", queries_per_class, 1)
        classes, members = _class_members(labels, "queries_per_class")
        parts = []
        for label, idx in zip(classes, members):
            if idx.size < queries_per_class:
                raise ValueError(
                    f"class {label.item()!r} has {idx.size} items, fewer than "
                    f"queries_per_class={queries_per_class}"
                )
            parts.append(idx[rng.permutation(idx.size)[:queries_per_class]])
        queries = np.concatenate(parts)
        if queries.size >= n:
            raise ValueError(
                f"queries_per_class={queries_per_class} takes every one of the {n} "
                "items as a query, leaving an empty database"
            )
    return _complement_split(queries, n)


def train_validation_split(
    labels: np.ndarray,
    validation_size: int | float = 0.1,
    seed: int = 0,
    stratify: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Holds out a validation split from a training set, reproducibly.

    With `stratify`, each class gets its proportional share of the
    `v` validation items, `v * n_c / n`, rounded by largest remainder (ties
    to the smaller class id) so that the shares sum to `v` exactly.

    Example:

    >>> y_train = np.repeat(np.arange(10), 5000)  # CIFAR-10's training labels
    >>> train, val = train_validation_split(y_train, 5000)
    >>> len(train), len(val)
    (45000, 5000)

    Args:
        labels: `(n,)` class ids (`(n, C)` allowed without `stratify`).
        validation_size: a count in [0, n - 1], or a fraction in [0, 1)
            (rounded to the nearest count).
        seed: seed of `np.random.default_rng`.
        stratify: keep the class proportions.

    Returns:
        `(train_indices, validation_indices)`: sorted int64, disjoint, together
        covering `range(n)`.

    Raises:
        ValueError: bad `validation_size` or labels.
    """
    labels = _check_labels(labels)
    seed = check_int("seed", seed, minimum=0)
    n = labels.shape[0]
    size = _check_split_size(validation_size, n)
    rng = np.random.default_rng(seed)
    if not stratify:
        validation, train = _complement_split(rng.permutation(n)[:size], n)
        return train, validation
    _, members = _class_members(labels, "stratify=True")
    counts = np.array([idx.size for idx in members], dtype=np.int64)
    quotas = size * counts / n
    shares = np.floor(quotas).astype(np.int64)
    # Largest remainder; a stable sort breaks ties towards earlier classes.
    order = np.argsort(-(quotas - shares), kind="stable")
    shares[order[: size - shares.sum()]] += 1
    validation = np.concatenate(
        [idx[rng.permutation(idx.size)[:k]] for idx, k in zip(members, shares)]
    )
    validation, train = _complement_split(validation, n)
    return train, validation


def _check_split_size(value, n: int) -> int:
    """A validation count in [0, n - 1] from a count or a fraction."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"validation_size must be an int or a float, received {value!r}"
        )
    if isinstance(value, numbers.Integral):
        size = int(value)
    else:
        if not 0.0 <= float(value) < 1.0:
            raise ValueError(
                f"validation_size as a fraction must be in [0, 1), received {value}"
            )
        size = round(float(value) * n)
    if not 0 <= size < n:
        raise ValueError(
            f"validation_size must be in [0, {n - 1}] for {n} items, received {value}"
        )
    return size


def _class_members(labels: np.ndarray, what: str) -> tuple[np.ndarray, list]:
    """Sorted classes and, for each, its sorted item indices (1-D labels)."""
    if labels.ndim != 1:
        raise ValueError(
            f"{what} needs 1-D class ids, received labels of shape {labels.shape}; "
            "for multi-hot labels use num_queries (query_database_split) or "
            "stratify=False (train_validation_split)"
        )
    if not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(f"labels must be integer class ids, received {labels.dtype}")
    classes, inverse = np.unique(labels, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=classes.size))[:-1]
    return classes, np.split(order.astype(np.int64), bounds)


def _check_labels(labels) -> np.ndarray:
    """`labels` as an array of shape `(n,)` or `(n, C)`, `n >= 1`, or raises."""
    labels = np.asarray(labels)
    if labels.ndim not in (1, 2) or labels.shape[0] == 0:
        raise ValueError(
            "labels must be a non-empty array of class ids (n,) or multi-hot "
            f"labels (n, C), received shape {labels.shape}"
        )
    return labels


def _complement_split(selected: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """`(sorted selected, sorted rest)` as int64 indices into `range(n)`."""
    mask = np.zeros(n, dtype=bool)
    mask[selected] = True
    return np.flatnonzero(mask).astype(np.int64), np.flatnonzero(~mask).astype(np.int64)
