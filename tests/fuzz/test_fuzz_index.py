"""Fuzz cases of the SubicIndex API: bad shapes, codes, queries, `k` and ids
refused by name; searches checked against an exact NumPy top-k."""

from __future__ import annotations

import numpy as np
import pytest
from fuzzing import SCALE, Case, Cases, K, M, run_case

from subic_keras.search import ShardedSubicIndex, SubicIndex

CASES = Cases()
case = CASES.add


# SubicIndex API ------------------------------------------------------------

_BAD_SHAPES = [
    ((0, 16), ValueError, "num_blocks must be >= 1, received 0"),
    ((4, 1), ValueError, "block_size must be >= 2, received 1"),
    ((4, 12), ValueError, "power of two"),
    ((4.5, 16), TypeError, "num_blocks must be an integer"),
    (("4", 16), TypeError, "num_blocks must be an integer"),
    ((4, None), TypeError, "block_size must be an integer"),
    ((-3, 16), ValueError, "num_blocks must be >= 1"),
    ((4, 2**40), ValueError, "block_size must be"),
]
for _i, (_args, _error, _fragment) in enumerate(_BAD_SHAPES):
    case(f"index-init-{_i}", _error, _fragment)(
        lambda world, args=_args: SubicIndex(*args)
    )


def _fresh(world) -> SubicIndex:
    index = SubicIndex(M, K)
    index.add(world["index"].get_codes(), ids=world["index"].get_ids())
    return index


_BAD_CODES = [
    (lambda r: r.integers(0, K, (5, M + 1)), ValueError, "codes must have width"),
    (lambda r: r.integers(K, 2 * K, (5, M)), ValueError, "must hold values in [0,"),
    (lambda r: -r.integers(1, 5, (5, M)), ValueError, "must hold values in [0,"),
    (lambda r: r.random((5, M)), ValueError, "must be integer codes"),
    (lambda r: r.integers(0, K, (5, M, 1)), ValueError, "must be a 2-D array"),
    (lambda r: np.full((5, M), np.nan), ValueError, "must be integer codes"),
    (lambda r: r.integers(0, K, (5,)), ValueError, "must be a 2-D array"),
]
_BAD_QUERIES = [
    (lambda r: r.random((3, M * K + 1)), ValueError, "queries must have width"),
    (
        lambda r: np.where(r.random((3, M * K)) < 0.1, np.nan, 1.0),
        ValueError,
        "queries must be finite",
    ),
    (lambda r: np.full((3, M * K), np.inf), ValueError, "queries must be finite"),
    (lambda r: r.random((3, M, K)), ValueError, "must be a 2-D array"),
    (lambda r: r.random((3, M * K)).astype(str), ValueError, "must hold real numbers"),
]
for _seed in range(10 * SCALE):
    for _i, (_make, _error, _fragment) in enumerate(_BAD_CODES):
        case(f"index-add-{_i}-{_seed}", _error, _fragment)(
            lambda world, make=_make, seed=_seed: _fresh(world).add(
                make(np.random.default_rng(seed))
            )
        )
    for _i, (_make, _error, _fragment) in enumerate(_BAD_QUERIES):
        case(f"index-search-{_i}-{_seed}", _error, _fragment)(
            lambda world, make=_make, seed=_seed: world["index"].search(
                make(np.random.default_rng(seed)), 5
            )
        )


for _i, (_k, _error, _fragment) in enumerate(
    [
        (0, ValueError, "k must be >= 1, received 0"),
        (-5, ValueError, "k must be >= 1, received -5"),
        (2.5, TypeError, "k must be an integer"),
        ("10", TypeError, "k must be an integer"),
        (None, TypeError, "k must be an integer"),
    ]
):
    case(f"index-k-{_i}", _error, _fragment)(
        lambda world, k=_k: world["index"].search(np.ones((2, M * K)), k)
    )


def _exact_top(world, queries, k):
    codes, ids = world["index"].get_codes(), world["index"].get_ids()
    scores = queries.reshape(len(queries), M, K)[:, np.arange(M), codes].sum(-1)
    return np.sort(scores, axis=1)[:, ::-1][:, :k], ids


def _check_search(k):
    def check(result, world, queries):
        scores, ids = result
        expected, _ = _exact_top(world, queries, k)
        found = min(k, len(world["index"]))
        assert scores.shape == ids.shape == (len(queries), found)
        np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)
        assert (ids >= 0).all()

    return check


for _seed in range(8 * SCALE):
    for _k in (1, 7, 300, 301, 1000):
        _queries = np.random.default_rng(_seed).normal(size=(4, M * K))
        if _seed % 2:
            _queries[:, 0] = 1e30  # one huge entry
        case(
            f"index-search-ok-{_k}-{_seed}",
            check=lambda result, world, k=_k, q=_queries: _check_search(k)(
                result, world, q
            ),
        )(lambda world, k=_k, q=_queries: world["index"].search(q, k))


case("index-remove-unknown", KeyError, "ids not in the index")(
    lambda world: _fresh(world).remove([1])
)
case("index-duplicate-ids", ValueError, "ids must be unique, repeated: [3]")(
    lambda world: SubicIndex(M, K).add(np.zeros((2, M), int), ids=[3, 3])
)
case("index-existing-ids", ValueError, "already")(
    lambda world: _fresh(world).add(np.zeros((1, M), int), ids=[7])
)
case("sharded-same-shard", ValueError, "received the same one")(
    lambda world: ShardedSubicIndex([world["index"], world["index"]])
)
case("sharded-overlap", ValueError, "ids")(
    lambda world: ShardedSubicIndex([world["index"], _fresh(world)])
)


def test_there_are_enough_cases():
    assert len(CASES) >= 170 * SCALE
    assert len(set(CASES.ids())) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=CASES.ids())
def test_case(case: Case, world, capsys, record_property):
    run_case(case, world, capsys, record_property)
