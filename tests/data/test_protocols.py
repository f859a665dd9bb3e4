"""Retrieval protocols and splits (`subic_keras.data.protocols`), NumPy only."""

import numpy as np
import pytest

from subic_keras.data.protocols import (
    RETRIEVAL_PROTOCOLS,
    held_out_classes,
    protocol_split,
    query_database_split,
    train_validation_split,
)


def _check_partition(first, second, n):
    for part in (first, second):
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0)  # Sorted, no repeats.
    np.testing.assert_array_equal(
        np.sort(np.concatenate([first, second])), np.arange(n)
    )


def test_query_database_split_per_class():
    labels = np.repeat(np.arange(5), [10, 12, 8, 30, 9])
    rng = np.random.default_rng(0)
    labels = labels[rng.permutation(labels.size)]
    queries, database = query_database_split(labels, queries_per_class=3, seed=7)
    _check_partition(queries, database, labels.size)
    np.testing.assert_array_equal(np.bincount(labels[queries]), [3] * 5)
    again = query_database_split(labels, queries_per_class=3, seed=7)
    np.testing.assert_array_equal(again[0], queries)
    other, _ = query_database_split(labels, queries_per_class=3, seed=8)
    assert not np.array_equal(other, queries)
    # Queries are spread over each class, not its first members.
    firsts = np.concatenate([np.flatnonzero(labels == c)[:3] for c in range(5)])
    assert not np.array_equal(np.sort(firsts), queries)


def test_query_database_split_num_queries():
    rng = np.random.default_rng(0)
    multi_hot = (rng.random((50, 4)) < 0.3).astype(np.int64)
    queries, database = query_database_split(multi_hot, num_queries=20, seed=1)
    _check_partition(queries, database, 50)
    assert queries.size == 20
    # num_queries takes precedence over the per-class default.
    labels = np.arange(50) % 5
    queries, _ = query_database_split(labels, queries_per_class=2, num_queries=7)
    assert queries.size == 7
    np.testing.assert_array_equal(
        queries, query_database_split(labels, None, num_queries=7)[0]
    )


def test_query_database_split_errors():
    labels = np.repeat(np.arange(3), [5, 2, 5])
    with pytest.raises(ValueError, match="class 1 has 2 items, fewer than"):
        query_database_split(labels, queries_per_class=3)
    with pytest.raises(ValueError, match="both None"):
        query_database_split(labels, queries_per_class=None)
    with pytest.raises(ValueError, match="num_queries must be < the number"):
        query_database_split(labels, num_queries=12)
    with pytest.raises(ValueError, match="empty database"):
        query_database_split(np.arange(4) % 2, queries_per_class=2)
    with pytest.raises(ValueError, match=r"1-D class ids.*num_queries"):
        query_database_split(np.eye(3, dtype=int), queries_per_class=1)
    with pytest.raises(TypeError, match="integer class ids"):
        query_database_split(labels.astype(float), queries_per_class=1)


def test_train_validation_split_stratified():
    labels = np.repeat(np.array([2, 5, 9]), [50, 30, 20])
    labels = labels[np.random.default_rng(1).permutation(100)]
    train, validation = train_validation_split(labels, 0.1, seed=3)
    _check_partition(train, validation, 100)
    values, counts = np.unique(labels[validation], return_counts=True)
    np.testing.assert_array_equal(values, [2, 5, 9])
    np.testing.assert_array_equal(counts, [5, 3, 2])
    again = train_validation_split(labels, 0.1, seed=3)
    np.testing.assert_array_equal(again[1], validation)
    assert not np.array_equal(
        train_validation_split(labels, 0.1, seed=4)[1], validation
    )
    # Largest remainder: 7 * (50, 30, 20) / 100 = (3.5, 2.1, 1.4) -> (4, 2, 1).
    _, validation = train_validation_split(labels, 7, seed=0)
    np.testing.assert_array_equal(np.bincount(labels[validation])[[2, 5, 9]], [4, 2, 1])


def test_train_validation_split_plain_and_errors():
    labels = np.eye(4, dtype=np.int64)[np.arange(30) % 4]  # Multi-hot is fine.
    train, validation = train_validation_split(labels, 0.2, stratify=False)
    _check_partition(train, validation, 30)
    assert validation.size == 6
    train, validation = train_validation_split(np.arange(30) % 4, 0)
    assert validation.size == 0 and train.size == 30
    with pytest.raises(ValueError, match="stratify=False"):
        train_validation_split(labels, 0.2)
    with pytest.raises(ValueError, match=r"fraction must be in \[0, 1\), received 1.5"):
        train_validation_split(np.arange(10), 1.5)
    with pytest.raises(ValueError, match=r"validation_size must be in \[0, 9\]"):
        train_validation_split(np.arange(10), 10)
    with pytest.raises(TypeError, match="validation_size"):
        train_validation_split(np.arange(10), "10%")


def test_protocol_splits():
    labels = np.repeat(np.arange(10), 1000)
    queries, database = protocol_split("paper", labels, seed=1)
    assert len(queries) == 1000 and len(database) == 9000
    assert np.all(np.bincount(labels[queries]) == 100)
    assert np.intersect1d(queries, database).size == 0
    again, _ = protocol_split("paper", labels, seed=1)
    np.testing.assert_array_equal(queries, again)

    queries, database = protocol_split("dsh", labels)
    np.testing.assert_array_equal(queries, np.arange(10000))
    np.testing.assert_array_equal(database, np.arange(10000))

    queries, database = protocol_split("random", labels, num_queries=250)
    assert len(queries) == 250 and len(database) == 9750
    queries, _ = protocol_split("random", labels, queries_per_class=3)
    assert np.all(np.bincount(labels[queries]) == 3)
    assert set(RETRIEVAL_PROTOCOLS) == {"paper", "dsh", "random", "unseen"}


def test_unseen_classes_splits_hold_out_disjoint_quarters():
    splits = [held_out_classes(10, split) for split in range(3)]
    assert all(len(held) == 3 for held in splits)
    assert len(set().union(*splits)) == 9  # no class held out twice
    with pytest.raises(ValueError, match="split must be < 3"):
        held_out_classes(10, 3)
    assert held_out_classes(4, 1) != held_out_classes(4, 0)  # one class each


def test_the_unseen_protocol_draws_from_held_out_classes_only():
    labels = np.repeat(np.arange(10), 300)
    held = held_out_classes(10, 1)
    queries, database = protocol_split("unseen", labels, seed=3, classes=held)
    assert set(labels[queries]) == set(labels[database]) == set(held)
    assert len(queries) == 300 and len(database) == 600
    assert not set(queries) & set(database)
    queries, _ = protocol_split(
        "unseen", labels, classes=list(held), queries_per_class=5
    )
    assert len(queries) == 15
    for kwargs, message in (
        ({"classes": None}, "goes with protocol 'unseen' and only with it"),
        ({"classes": held, "num_queries": 10}, "give queries_per_class"),
        ({"classes": [12]}, "classes must name classes of labels"),
    ):
        with pytest.raises(ValueError, match=message):
            protocol_split("unseen", labels, **kwargs)
    with pytest.raises(ValueError, match="goes with protocol 'unseen'"):
        protocol_split("paper", labels, classes=held)
