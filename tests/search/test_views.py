"""`search.views`: an index held still, and the exact top `k` of it."""

import numpy as np
import pytest

from subic_keras.search import SubicIndex, native, views
from subic_keras.search.views import every_score, top_k, top_positions


def _index():
    rng = np.random.default_rng(0)
    index = SubicIndex(num_blocks=3, block_size=8)
    index.add(rng.integers(0, 8, (50, 3)), ids=rng.permutation(1000)[:50])
    return index, rng.normal(size=(7, 24)).astype(np.float32)


def test_every_score_is_the_brute_force_matrix_in_id_order():
    index, queries = _index()
    codes, ids = index.get_codes(), index.get_ids()
    brute = queries[:, codes + np.arange(3) * 8].sum(-1)
    with index.view() as view:
        scores, columns = every_score(view, queries, chunk=3)
    order = np.argsort(ids)
    np.testing.assert_array_equal(columns, ids[order])
    np.testing.assert_allclose(scores, brute[:, order], rtol=1e-6, atol=1e-6)


def test_top_k_keeps_only_kept_items_and_maps_positions_to_ids():
    index, queries = _index()
    keep = np.zeros(len(index), bool)
    keep[[3, 9, 40]] = True
    with index.view() as view:
        scores, positions = top_positions(view, queries, 10, 2, keep)
        _, ids = top_k(view, queries, 10, 2, keep)
        assert positions.shape == (7, 3) and set(positions.ravel()) == {3, 9, 40}
        np.testing.assert_array_equal(ids, view.ids[positions])
        assert np.all(np.diff(scores, axis=1) <= 0)
        # Nothing kept: an empty answer, not an error.
        empty, _ = top_k(view, queries, 10, 2, np.zeros(len(index), bool))
        assert empty.shape == (7, 0)


def _tied(rng, num_blocks, n=3000):
    """Class codes that repeat (values 0/1 in most blocks), queries that make
    distinct codes score alike (zero blocks), and random instance codes."""
    codes = rng.integers(0, 2, (n, num_blocks))
    codes[rng.random(n) < 0.1, -1] = 7  # rarer codes, their own small groups
    classes = SubicIndex(num_blocks, 16)
    classes.add(codes)
    instance = SubicIndex(8, 16)
    instance.add(rng.integers(0, 16, (n, 8)))
    queries = rng.normal(size=(9, num_blocks * 16)).astype(np.float32)
    queries[::2, : 16 * (num_blocks // 2)] = 0.0  # half the blocks say nothing
    queries[1] = 0.0  # every item ties
    wanted = rng.normal(size=(9, 8 * 16)).astype(np.float32)
    return classes, instance, queries, wanted


@pytest.mark.skipif(not native.kernels(), reason="the C extension is not built")
@pytest.mark.parametrize("num_blocks", [6, 20])  # codes of 3 bytes; of 10 (> 8)
@pytest.mark.parametrize("k", [1, 5, 40, 3001])
@pytest.mark.parametrize("max_tied", [views.MAX_TIED, 50])
def test_ties_ordered_in_c_equal_the_order_of_one_query_at_a_time(
    rng, num_blocks, k, max_tied, monkeypatch
):
    classes, instance, queries, wanted = _tied(rng, num_blocks)
    monkeypatch.setattr(views, "MAX_TIED", max_tied)
    keep = rng.random(len(classes)) < 0.7
    answers = []
    for built in (True, False):
        if not built:  # the one-query-at-a-time order, where C is not built
            monkeypatch.setattr(native, "order_ties", lambda *args: None)
        key = instance.second_code(wanted)
        answers.append(
            [classes.search_kept(queries, k, kept, key=key) for kept in (None, keep)]
        )
        none = np.zeros(len(classes), bool)
        nothing = classes.search_kept(queries, k, none, key=key)
        assert nothing[0].shape == nothing[1].shape == (9, 0)
    for (c_scores, c_ids), (py_scores, py_ids) in zip(*answers):
        np.testing.assert_array_equal(c_ids, py_ids)
        np.testing.assert_array_equal(c_scores, py_scores)
    # Equal class scores are in instance score order, then insertion order.
    scores, ids = answers[0][0]
    keys = np.stack([instance.second_code(wanted).scores(r, ids[r]) for r in range(9)])
    same = scores[:, 1:] == scores[:, :-1]
    assert np.all(~same | (keys[:, 1:] <= keys[:, :-1]))
    assert np.all(~same | (keys[:, 1:] < keys[:, :-1]) | (ids[:, 1:] > ids[:, :-1]))


@pytest.mark.skipif(not native.kernels(), reason="the C extension is not built")
def test_the_tie_binding_refuses_what_would_read_out_of_bounds(rng):
    classes, instance, _, wanted = _tied(rng, 6, n=50)
    key = instance.second_code(wanted)
    store = classes._store
    scores = np.zeros((9, 3), np.float32)
    positions = np.zeros((9, 3), np.int64)
    positions[4, 1] = 50
    with pytest.raises(ValueError, match="positions out of range"):
        native.order_ties(scores, positions, 2, store, None, key, 10)
    with pytest.raises(ValueError, match="keep must hold one entry an item"):
        native.order_ties(scores, positions * 0, 2, store, np.ones(49, bool), key, 10)
    with pytest.raises(ValueError, match="sizes out of range"):  # wide > k + 1
        native.order_ties(scores, positions * 0, 1, store, None, key, 10)
    # A group that goes on past the scan needs the codes sorted by their
    # first bytes; where none does, they are not sorted (nor passed).
    with pytest.raises(ValueError, match="order is needed"):
        _scan = native._scan
        packed = store.packed()
        _scan.order_ties(
            scores, positions * 0, 9, 3, 2, packed, len(packed), packed.shape[1],
            b"", b"", b"", key.packed, key.packed.shape[1], key.nbits, 8, 10,
            key.queries, np.empty((9, 2), np.float32), np.empty((9, 2), np.int64),
        )  # fmt: skip
    distinct = SubicIndex(2, 16)
    distinct.add(np.stack(np.divmod(np.arange(50), 16), axis=1))
    queries = rng.normal(size=(9, 32)).astype(np.float32)  # no equal scores
    distinct.search_kept(queries, 3, None, key=key)
    assert distinct._store._same is None
