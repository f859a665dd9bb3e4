"""Fixtures of the serving tests.

For the server's tests, a folder of 60 PNGs with a model and its index file,
and a server on it (per module). For the export tests, one DSH-CNN SuBiC
(4 blocks of 16) trained for one epoch on 300 CIFAR-10 images, made once per
worker (session scope) for test_export.py and test_litert_export.py, which
one worker runs (their `xdist_group`)."""

from __future__ import annotations

import keras
import pytest
from exported import K, M, tiny_subic
from served import UPLOAD_LIMIT, ThreadServer, picture_folder, save_model

from subic_keras import build_subic
from subic_keras.data import datasets
from subic_keras.models import backbones
from subic_keras.serving import retrieval
from subic_keras.serving.export import load_subic
from subic_keras.serving.server import SearchService
from subic_keras.training import standardization


@pytest.fixture(scope="session")
def cifar(shared_data_dir):
    (x_train, y_train), (x_test, _) = datasets.load_cifar10(
        shared_data_dir, max_per_split=300
    )
    return x_train, y_train, x_test[:64]


@pytest.fixture(scope="session")
def trained(cifar):
    x_train, y_train, _ = cifar
    keras.utils.set_random_seed(0)
    subic = build_subic(
        backbones.dsh_cnn(input_shape=(32, 32, 3)),
        M,
        K,
        10,
        input_shape=(32, 32, 3),
        preprocessing=standardization(x_train),
    )
    subic.train_model.fit(
        x_train.astype("float32") / 255.0, y_train, batch_size=50, epochs=1, verbose=0
    )
    return subic


@pytest.fixture(scope="session")
def keras_outputs(trained, cifar):
    images = cifar[2].astype("float32") / 255.0
    return trained.encode(images), trained.query(images)


@pytest.fixture(scope="session")
def keras_class_query(trained, cifar):
    return trained.query(cifar[2].astype("float32") / 255.0, kind="class_posterior")


@pytest.fixture(scope="session")
def tiny():
    keras.utils.set_random_seed(1)
    return tiny_subic()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A folder of 60 PNGs, a model, and the folder's index file."""
    base = tmp_path_factory.mktemp("serving")
    root = base / "photos"
    paths = picture_folder(root)
    model = save_model(base / "model.keras")
    index, report = retrieval.index_folder(load_subic(model), root)
    assert report.added == 60 and not report.skipped
    index.save(base / "photos.subic")
    return {
        "root": root,
        "paths": paths,
        "model": model,
        "index": base / "photos.subic",
    }


@pytest.fixture(scope="module")
def served(photos):
    service = SearchService(
        photos["model"], str(photos["index"]), max_upload_bytes=UPLOAD_LIMIT
    )
    with ThreadServer(service) as port:
        yield port, service
