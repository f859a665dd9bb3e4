"""Fixtures of the baselines' tests."""

import faiss
import pytest

from subic_keras.data import datasets


@pytest.fixture(scope="module", autouse=True)
def single_faiss_thread():
    # faiss's OpenMP threads spin while they wait; on a small shared machine
    # that turns milliseconds of k-means into seconds.
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(previous)


@pytest.fixture(scope="module")
def cifar(shared_data_dir):
    (x_train, y_train), (x_test, y_test) = datasets.load_cifar10(
        shared_data_dir / "cifar-10-batches-bin", max_per_split=300
    )
    # Per-image scaling keeps the tiny from-scratch runs well conditioned.
    scale = lambda x: (x.astype("float32") - 127.5) / 64.0  # noqa: E731
    return (scale(x_train), y_train), (scale(x_test), y_test)
