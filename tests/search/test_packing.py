"""Tests for subic_keras.search.packing."""

import faiss
import numpy as np
import pytest

from subic_keras.search import packing


@pytest.mark.parametrize("nbits", range(1, 11))
def test_bit_packing_matches_faiss(rng, nbits):
    codes = rng.integers(0, 1 << nbits, (50, 7))
    packed = packing.pack(codes, nbits)
    expected = faiss.pack_bitstrings(codes.astype(np.int32), nbits)
    np.testing.assert_array_equal(packed, expected)
    np.testing.assert_array_equal(packing.unpack(packed, 7, nbits), codes)


@pytest.fixture(autouse=True)
def scanner():
    """One run: packing does not depend on the scanner."""
    return None
