"""Fixtures of the search tests."""

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True, params=["native", "faiss"])
def engine(request, monkeypatch):
    """Every search test runs on both scans: the native one (where it was
    built) and faiss's engines (`test_native.py` overrides it)."""
    if request.param == "faiss":
        monkeypatch.setenv("SUBIC_NATIVE", "0")
    return request.param
