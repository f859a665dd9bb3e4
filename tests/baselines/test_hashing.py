"""`Binarize` and `hamming_search` (`subic_keras.baselines.hashing`)."""

import keras
import numpy as np
import pytest

from subic_keras.baselines import (
    Binarize,
    hamming_search,
)
from subic_keras.evaluation import retrieval_metrics as evaluation


def test_binarize_layer():
    layer = Binarize(0.5)
    bits = keras.ops.convert_to_numpy(layer(np.array([[0.2, 0.5, 0.7]], "float32")))
    np.testing.assert_array_equal(bits, [[0, 0, 1]])
    assert bits.dtype == np.int32
    assert Binarize.from_config(layer.get_config()).threshold == 0.5
    with pytest.raises(ValueError, match="threshold must be finite"):
        Binarize(float("nan"))


@pytest.mark.parametrize("num_bits", [12, 64])
def test_hamming_search_matches_hamming_scores(num_bits):
    rng = np.random.default_rng(num_bits)
    query = rng.integers(0, 2, (7, num_bits))
    database = rng.integers(0, 2, (40, num_bits))
    distances, indices = hamming_search(query, database, k=10)
    assert distances.shape == indices.shape == (7, 10)
    full = -evaluation.hamming_scores(query, database)
    np.testing.assert_array_equal(distances, np.sort(full, axis=1)[:, :10])
    np.testing.assert_array_equal(np.take_along_axis(full, indices, 1), distances)
    packed = hamming_search(
        np.packbits(query.astype(np.uint8), axis=1),
        np.packbits(database.astype(np.uint8), axis=1),
        k=10,
        packed=True,
    )
    np.testing.assert_array_equal(packed[0], distances)


def test_hamming_search_bad_arguments():
    bits = np.zeros((5, 8), int)
    with pytest.raises(ValueError, match="k must be <= the number of database codes"):
        hamming_search(bits, bits, k=6)
    with pytest.raises(ValueError, match="database_bits must hold bits 0 or 1"):
        hamming_search(bits, bits + 2, k=1)
    with pytest.raises(ValueError, match="same number of columns"):
        hamming_search(bits, np.zeros((5, 16), int), k=1)
    with pytest.raises(TypeError, match="query_bits must have dtype uint8"):
        hamming_search(bits, bits, k=1, packed=True)
