"""Tests for subic_keras.evaluation.retrieval_metrics, against independent
references."""

import itertools
import json

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from subic_keras.evaluation import retrieval_metrics as ev

TIES = ("pessimistic", "optimistic", "expected", "index")


# ---------------------------------------------------------------------------
# Independent, deliberately naive references.


def _ap_of_sequence(relevant, top_k=None):
    """AP (full) or AP@k (divided by hits in the top k) of a 0/1 sequence."""
    relevant = list(relevant)
    total = sum(relevant)
    if top_k is not None:
        relevant = relevant[:top_k]
    hits, acc = 0, 0.0
    for rank, rel in enumerate(relevant, start=1):
        if rel:
            hits += 1
            acc += hits / rank
    if top_k is None:
        return acc / total
    return acc / hits if hits else 0.0


def _orderings(scores):
    """Every order of indices by decreasing score, over all tie permutations."""
    groups = [np.flatnonzero(scores == v) for v in sorted(set(scores), reverse=True)]
    for parts in itertools.product(*(itertools.permutations(g) for g in groups)):
        yield [i for part in parts for i in part]


def _brute_force(scores, relevant, top_k=None):
    """Min, mean and max AP over every order of the tie groups."""
    values = [_ap_of_sequence(relevant[o], top_k) for o in _orderings(scores)]
    return min(values), float(np.mean(values)), max(values)


def _tie_rule_order(scores, relevant, relevant_first):
    """Decreasing score; inside ties, relevant items first or last."""
    tie_key = -relevant if relevant_first else relevant
    return np.lexsort((tie_key, -scores))


def _interpolated_reference(relevant, levels):
    relevant = np.asarray(relevant)
    hits = np.cumsum(relevant)
    precision = hits / np.arange(1, len(relevant) + 1)
    recall = hits / relevant.sum()
    out = []
    for t in np.linspace(0, 1, levels):
        mask = recall >= t - 1e-12
        out.append(precision[mask].max() if mask.any() else 0.0)
    return float(np.mean(out))


@pytest.fixture
def continuous():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(7, 40))
    query_labels = rng.integers(0, 4, size=7)
    database_labels = rng.integers(0, 4, size=40)
    return scores, query_labels, database_labels


# ---------------------------------------------------------------------------
# Average precision.


@pytest.mark.parametrize("ties", TIES)
def test_ap_matches_sklearn_class_ids(continuous, ties):
    scores, q, db = continuous
    ap = ev.average_precision(scores, q, db, ties=ties)
    for i in range(len(q)):
        expected = average_precision_score(db == q[i], scores[i])
        np.testing.assert_allclose(ap[i], expected, rtol=1e-12)
    assert ev.mean_average_precision(scores, q, db, ties=ties) == pytest.approx(
        ap.mean(), rel=1e-12
    )


@pytest.mark.parametrize("ties", TIES)
def test_ap_matches_sklearn_multi_hot(ties):
    rng = np.random.default_rng(1)
    scores = rng.random((5, 30))
    q = (rng.random((5, 6)) < 0.3).astype(np.int64)
    q[:, 0] = 1  # every query has a label
    db = rng.random((30, 6)) < 0.3
    ap = ev.average_precision(scores, q, db, ties=ties)
    for i in range(5):
        relevant = (db & q[i].astype(bool)).any(axis=1)
        if relevant.any():
            assert ap[i] == pytest.approx(average_precision_score(relevant, scores[i]))
        else:
            assert np.isnan(ap[i])


def test_ties_hand_case():
    # Ranks: item 0 (relevant), then a tie {1 irrelevant, 2 relevant}, then 3.
    # Relevant after the tie: (1/1 + 2/3)/2 = 5/6; before it: (1 + 1)/2 = 1;
    # expected: the two orders are equally likely, (5/6 + 1)/2 = 11/12.
    scores = np.array([[2.0, 1.0, 1.0, 0.0]])
    q, db = np.array([1]), np.array([1, 0, 1, 0])
    got = {t: ev.average_precision(scores, q, db, ties=t)[0] for t in TIES}
    assert got["pessimistic"] == pytest.approx(5 / 6)
    assert got["optimistic"] == pytest.approx(1.0)
    assert got["expected"] == pytest.approx(11 / 12)
    assert got["index"] == pytest.approx(5 / 6)
    # Database index breaks the tie: the relevant item 1 now comes first.
    assert ev.average_precision(scores, q, [1, 1, 0, 0], ties="index")[0] == 1.0
    assert ev.average_precision(scores, q, [1, 1, 0, 0], ties="pessimistic")[
        0
    ] == pytest.approx(5 / 6)


@pytest.mark.parametrize("top_k", [None, 1, 3, 5, 8])
def test_ties_match_enumeration_of_all_orders(top_k):
    rng = np.random.default_rng(2)
    scores = rng.integers(0, 3, size=(12, 8)).astype(np.float64)
    q = rng.integers(0, 2, size=12)
    db = rng.integers(0, 2, size=8)
    got = {t: ev.average_precision(scores, q, db, top_k=top_k, ties=t) for t in TIES}
    for i in range(len(q)):
        relevant = (db == q[i]).astype(int)
        if not relevant.any():
            assert all(np.isnan(got[t][i]) for t in TIES)
            continue
        low, mean, high = _brute_force(scores[i], relevant, top_k)
        assert got["expected"][i] == pytest.approx(mean, abs=1e-12)
        for t, first in (("pessimistic", False), ("optimistic", True)):
            order = _tie_rule_order(scores[i], relevant, relevant_first=first)
            assert got[t][i] == pytest.approx(
                _ap_of_sequence(relevant[order], top_k), abs=1e-12
            )
        if top_k is None:
            # On the full ranking the tie rules are the worst and best cases
            # (AP@k, divided by the random R_k, need not be monotone).
            assert got["pessimistic"][i] == pytest.approx(low, abs=1e-12)
            assert got["optimistic"][i] == pytest.approx(high, abs=1e-12)
        stable = np.argsort(-scores[i], kind="stable")
        assert got["index"][i] == pytest.approx(
            _ap_of_sequence(relevant[stable], top_k), abs=1e-12
        )


def test_expected_top_k_in_a_large_tie_group():
    # One tie group of 9 items with 4 relevant, after one relevant item; the
    # cut at k = 4 takes 3 of the group. Enumerate the 9! orders' patterns by
    # choosing the relevant positions (all C(9,4) equally likely).
    scores = np.array([[5.0] + [1.0] * 9])
    db = np.array([1, 0, 1, 0, 1, 0, 0, 1, 1, 0])
    values = []
    for chosen in itertools.combinations(range(9), 4):
        sequence = [1] + [int(j in chosen) for j in range(9)]
        values.append(_ap_of_sequence(sequence, top_k=4))
    got = ev.average_precision(scores, [1], db, top_k=4, ties="expected")[0]
    assert got == pytest.approx(np.mean(values), abs=1e-12)


def test_top_k_hand_case():
    # Relevance in rank order 1, 0, 1, 0, 1 (R = 3).
    scores = np.array([[5.0, 4.0, 3.0, 2.0, 1.0], [5.0, 4.0, 3.0, 2.0, 1.0]])
    db = np.array([1, 0, 1, 0, 1])
    q = np.array([1, 0])
    ap3 = ev.average_precision(scores, q, db, top_k=3)
    assert ap3[0] == pytest.approx((1 + 2 / 3) / 2)  # R_3 = 2, not min(3, R)
    # Query 1 (class 0): relevant at ranks 2 and 4, so AP@1 retrieves none.
    assert ev.average_precision(scores, q, db, top_k=1)[1] == 0.0
    assert ev.average_precision(scores, q, db, top_k=1)[0] == 1.0
    full = ev.average_precision(scores, q, db)
    np.testing.assert_allclose(ev.average_precision(scores, q, db, top_k=5), full)
    assert full[0] == pytest.approx((1 + 2 / 3 + 3 / 5) / 3)


def test_interpolation_hand_case():
    # Relevance 1, 0, 1, 0: precision 1, 1/2, 2/3, 1/2 at recall 1/2, 1/2, 1, 1.
    # Levels t <= 1/2 get 1, levels above get 2/3.
    scores = np.array([[4.0, 3.0, 2.0, 1.0]])
    q, db = [1], [1, 0, 1, 0]
    eleven = ev.mean_average_precision(scores, q, db, interpolation="11point")
    twenty_one = ev.mean_average_precision(scores, q, db, interpolation="21point")
    assert eleven == pytest.approx((6 * 1 + 5 * 2 / 3) / 11)  # 28/33
    assert twenty_one == pytest.approx((11 * 1 + 10 * 2 / 3) / 21)  # 53/63


@pytest.mark.parametrize("levels,name", [(11, "11point"), (21, "21point")])
def test_interpolation_matches_reference(continuous, levels, name):
    scores, q, db = continuous
    ap = ev.average_precision(scores, q, db, interpolation=name, ties="index")
    for i in range(len(q)):
        relevant = (db == q[i])[np.argsort(-scores[i], kind="stable")]
        assert ap[i] == pytest.approx(_interpolated_reference(relevant, levels))


def test_interpolation_unsupported_combinations(continuous):
    scores, q, db = continuous
    with pytest.raises(NotImplementedError, match="expected"):
        ev.average_precision(scores, q, db, interpolation="21point", ties="expected")
    with pytest.raises(ValueError, match="top_k"):
        ev.average_precision(scores, q, db, top_k=5, interpolation="11point")


def test_queries_without_relevant_items_are_excluded():
    scores = np.array([[3.0, 2.0, 1.0], [3.0, 2.0, 1.0], [1.0, 2.0, 3.0]])
    q, db = np.array([0, 7, 0]), np.array([0, 1, 1])
    ap = ev.average_precision(scores, q, db)
    assert np.isnan(ap[1])
    assert ev.mean_average_precision(scores, q, db) == pytest.approx((1 + 1 / 3) / 2)
    assert ev.precision_at_k(scores, q, db, 1) == pytest.approx(0.5)
    result = ev.evaluate_retrieval(scores, q, db, ks=(1,))
    assert result["num_queries"] == 2
    assert result["num_queries_without_relevant"] == 1
    with pytest.raises(ValueError, match="no query has a relevant"):
        ev.mean_average_precision(scores[1:2], q[1:2], db)


@pytest.mark.parametrize("ties", TIES)
@pytest.mark.parametrize("top_k", [None, 4])
def test_chunking_does_not_change_results(ties, top_k):
    rng = np.random.default_rng(3)
    scores = rng.integers(-6, 0, size=(23, 31))
    q, db = rng.integers(0, 3, size=23), rng.integers(0, 3, size=31)
    whole = ev.average_precision(scores, q, db, top_k, ties=ties, chunk_size=100)
    for chunk_size in (1, 4, None):
        np.testing.assert_array_equal(
            ev.average_precision(
                scores, q, db, top_k, ties=ties, chunk_size=chunk_size
            ),
            whole,
        )
    curve = ev.precision_recall_curve(scores, q, db, 7, ties=ties, chunk_size=100)
    chunked = ev.precision_recall_curve(scores, q, db, 7, ties=ties, chunk_size=3)
    np.testing.assert_array_equal(curve, chunked)


def test_integer_scores_extremes_with_index_ties():
    # Negating int64 min would overflow; the ranking must not negate.
    info = np.iinfo(np.int64)
    scores = np.array([[info.min, info.max, info.min, 0]])
    ap = ev.average_precision(scores, [1], [1, 0, 0, 1], ties="index")
    assert ap[0] == pytest.approx(_ap_of_sequence([0, 1, 1, 0]))


# ---------------------------------------------------------------------------
# Precision, recall, curves, summary.


@pytest.mark.parametrize("k", [1, 3, 6])
def test_precision_recall_at_k_match_enumeration(k):
    rng = np.random.default_rng(4)
    scores = rng.integers(0, 3, size=(6, 7))
    q, db = rng.integers(0, 2, size=6), rng.integers(0, 2, size=7)
    precision = {t: [] for t in ("pessimistic", "expected", "optimistic")}
    recall = {t: [] for t in precision}
    for i in range(6):
        relevant = (db == q[i]).astype(int)
        if not relevant.any():
            continue
        counts = [relevant[o][:k].sum() for o in _orderings(scores[i])]
        for t, c in zip(precision, (min(counts), np.mean(counts), max(counts))):
            precision[t].append(c / k)
            recall[t].append(c / relevant.sum())
    for t in precision:
        assert ev.precision_at_k(scores, q, db, k, ties=t) == pytest.approx(
            np.mean(precision[t])
        )
        assert ev.recall_at_k(scores, q, db, k, ties=t) == pytest.approx(
            np.mean(recall[t])
        )


def test_precision_recall_curve_matches_pointwise(continuous):
    scores, q, db = continuous
    precision, recall = ev.precision_recall_curve(scores, q, db, num_points=5)
    cutoffs = [1, 11, 20, 30, 40]  # round(linspace(1, 40, 5))
    assert len(precision) == len(recall) == 5
    for k, p, r in zip(cutoffs, precision, recall):
        assert p == pytest.approx(ev.precision_at_k(scores, q, db, k))
        assert r == pytest.approx(ev.recall_at_k(scores, q, db, k))
    assert np.all(np.diff(recall) >= 0) and recall[-1] == pytest.approx(1.0)


def test_evaluate_retrieval_is_consistent_and_json(continuous):
    scores, q, db = continuous
    result = ev.evaluate_retrieval(scores, q, db, ks=(1, 10), ties="expected")
    json.dumps(result)
    assert result["map"] == pytest.approx(
        ev.mean_average_precision(scores, q, db, ties="expected")
    )
    assert result["precision@10"] == pytest.approx(
        ev.precision_at_k(scores, q, db, 10, ties="expected")
    )
    assert result["recall@1"] == pytest.approx(
        ev.recall_at_k(scores, q, db, 1, ties="expected")
    )
    assert result["num_queries"] == 7 and result["top_k"] is None
    assert ev.evaluate_retrieval(scores, q, db, top_k=5, ks=())["map"] == (
        pytest.approx(ev.mean_average_precision(scores, q, db, top_k=5))
    )


# ---------------------------------------------------------------------------
# Scores from codes.


def test_hamming_scores_direct_and_packed():
    rng = np.random.default_rng(5)
    query = rng.integers(0, 2, size=(4, 13))
    database = rng.integers(0, 2, size=(9, 13)).astype(bool)
    direct = -(query[:, None, :] != database[None, :, :]).sum(axis=2)
    got = ev.hamming_scores(query, database)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, direct)
    packed = ev.hamming_scores(
        np.packbits(query.astype(np.uint8), axis=1),
        np.packbits(database, axis=1),
        packed=True,
    )
    np.testing.assert_array_equal(packed, direct)


def test_asymmetric_scores_matches_dense_one_hot():
    rng = np.random.default_rng(6)
    num_blocks, block_size = 3, 5
    z = rng.random((6, num_blocks * block_size)).astype(np.float32)
    codes = rng.integers(0, block_size, size=(11, num_blocks)).astype(np.uint8)
    one_hot = np.eye(block_size)[codes].reshape(11, -1)
    got = ev.asymmetric_scores(z, codes, num_blocks, block_size)
    assert got.shape == (6, 11) and got.dtype == np.float32
    np.testing.assert_allclose(got, z.astype(np.float64) @ one_hot.T, rtol=1e-6)


# ---------------------------------------------------------------------------
# Protocols.


# ---------------------------------------------------------------------------
# Bad input: every error names the argument.

_S = np.zeros((2, 3))
_Q = np.array([0, 1])
_D = np.array([0, 1, 1])


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: ev.mean_average_precision(np.zeros(3), _Q, _D), ValueError, "scores"),
        (
            lambda: ev.mean_average_precision(
                np.array([[np.nan, 0, 0], [0, 0, 0]]), _Q, _D
            ),
            ValueError,
            "scores must not contain NaN",
        ),
        (
            lambda: ev.mean_average_precision(_S.astype(str), _Q, _D),
            TypeError,
            "scores",
        ),
        (lambda: ev.mean_average_precision(_S, _Q[:1], _D), ValueError, "query_labels"),
        (
            lambda: ev.mean_average_precision(_S, _Q, _D[:2]),
            ValueError,
            "database_labels",
        ),
        (
            lambda: ev.mean_average_precision(_S, _Q.astype(float), _D),
            TypeError,
            "query_labels",
        ),
        (
            lambda: ev.mean_average_precision(_S, np.eye(2), _D),
            ValueError,
            "query_labels and database_labels",
        ),
        (
            lambda: ev.mean_average_precision(_S, np.full((2, 2), 2), np.eye(3)[:, :2]),
            ValueError,
            "query_labels",
        ),
        (lambda: ev.mean_average_precision(_S, _Q, _D, top_k=0), ValueError, "top_k"),
        (lambda: ev.mean_average_precision(_S, _Q, _D, top_k=4), ValueError, "top_k"),
        (lambda: ev.mean_average_precision(_S, _Q, _D, top_k=2.0), TypeError, "top_k"),
        (
            lambda: ev.mean_average_precision(_S, _Q, _D, ties="random"),
            ValueError,
            "ties",
        ),
        (
            lambda: ev.mean_average_precision(_S, _Q, _D, interpolation="11"),
            ValueError,
            "interpolation",
        ),
        (
            lambda: ev.mean_average_precision(_S, _Q, _D, chunk_size=0),
            ValueError,
            "chunk_size",
        ),
        (lambda: ev.precision_at_k(_S, _Q, _D, 0), ValueError, "k must"),
        (lambda: ev.recall_at_k(_S, _Q, _D, 9), ValueError, "k must"),
        (lambda: ev.precision_recall_curve(_S, _Q, _D, 1), ValueError, "num_points"),
        (lambda: ev.evaluate_retrieval(_S, _Q, _D, ks=5), TypeError, "ks"),
        (lambda: ev.evaluate_retrieval(_S, _Q, _D, ks=(1, 10)), ValueError, "ks"),
        (
            lambda: ev.hamming_scores(np.zeros(3), np.zeros((2, 3))),
            ValueError,
            "query_bits",
        ),
        (
            lambda: ev.hamming_scores(np.zeros((1, 3)), np.zeros((2, 4))),
            ValueError,
            "columns",
        ),
        (
            lambda: ev.hamming_scores(np.zeros((1, 3)), np.full((2, 3), 2)),
            ValueError,
            "database_bits",
        ),
        (
            lambda: ev.hamming_scores(np.zeros((1, 3)), np.zeros((2, 3)), packed=True),
            TypeError,
            "query_bits",
        ),
        (
            lambda: ev.asymmetric_scores(np.zeros((1, 6)), np.zeros((2, 2), int), 2, 4),
            ValueError,
            "queries_z",
        ),
        (
            lambda: ev.asymmetric_scores(
                np.full((1, 8), np.inf), np.zeros((2, 2), int), 2, 4
            ),
            ValueError,
            "queries_z must be finite",
        ),
        (
            lambda: ev.asymmetric_scores(np.zeros((1, 8)), np.full((2, 2), 4), 2, 4),
            ValueError,
            "database_codes",
        ),
        (
            lambda: ev.asymmetric_scores(np.zeros((1, 8)), np.zeros((2, 3), int), 2, 4),
            ValueError,
            "database_codes",
        ),
        (
            lambda: ev.asymmetric_scores(np.zeros((1, 8)), np.zeros((2, 2)), 2, 4),
            TypeError,
            "database_codes",
        ),
        (
            lambda: ev.asymmetric_scores(np.zeros((1, 8)), np.zeros((2, 8), int), 8, 1),
            ValueError,
            "block_size",
        ),
        (lambda: ev.protocol_split("cifar", _Q), ValueError, "name"),
        (
            lambda: ev.protocol_split("paper", _Q, num_queries=1),
            ValueError,
            "num_queries",
        ),
        (lambda: ev.protocol_split("random", _Q), ValueError, "num_queries"),
        (lambda: ev.protocol_split("dsh", np.zeros((0,))), ValueError, "labels"),
        (lambda: ev.protocol_split("paper", np.eye(3)), ValueError, "labels"),
    ],
)
def test_bad_input_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
