"""Fixtures of the search tests."""

import numpy as np
import pytest

from subic_keras.search import scanners

# Every scanner this machine runs: its native kernels (AVX-512 VBMI,
# AVX-512BW, AVX2, NEON, portable) and faiss's two scans.
SCANNERS = scanners.available(1, 16)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True, params=SCANNERS)
def scanner(request, monkeypatch):
    """Every search test runs on every scanner: `"auto"` means the one of
    the test's run (faiss's fast scan where `K = 16`, its exact scan
    elsewhere, for `"faiss-fastscan"`). A module whose tests do not depend
    on it overrides this fixture."""
    forced, resolve = request.param, scanners.resolve

    def resolve_forced(name, num_blocks, block_size):
        if name != "auto":
            return resolve(name, num_blocks, block_size)
        if forced in scanners.available(num_blocks, block_size):
            return forced
        return "faiss"  # faiss-fastscan, for K != 16

    monkeypatch.setattr(scanners, "resolve", resolve_forced)
    return forced
