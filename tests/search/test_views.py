"""`search.views`: an index held still, and the exact top `k` of it."""

import numpy as np

from subic_keras.search import SubicIndex
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
