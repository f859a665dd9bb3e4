"""Fixtures of the instance tests: a small instance code, its pictures, a
saved one with rules, and a folder holding two exact copies."""

import keras
import numpy as np
import pytest

from subic_keras.data.images import write_image_folder
from subic_keras.instance import instance_code as instance


def _small_code(num_blocks=4, block_size=16, seed=0):
    keras.utils.set_random_seed(seed)
    backbone = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
            keras.layers.Flatten(),
        ]
    )
    return instance.build_instance_subic(backbone, num_blocks, block_size)


@pytest.fixture(scope="module")
def pictures():
    rng = np.random.default_rng(0)
    return (
        rng.integers(0, 256, (120, 4, 4, 3)).repeat(4, 1).repeat(4, 2).astype(np.uint8)
    )


@pytest.fixture(scope="module")
def instance_model(tmp_path_factory, pictures):
    code = _small_code(seed=1)
    code.model.copy_margin, code.model.copy_blocks = -1e-3, 4
    path = tmp_path_factory.mktemp("instance") / "instance.keras"
    code.save(path, include_optimizer=False)
    return path


@pytest.fixture
def photos(tmp_path, pictures):
    """40 pictures in two folders, pictures 3 and 7 copied exactly once."""
    root = tmp_path / "photos"
    write_image_folder(pictures[:40], np.arange(40) % 2, root, ["a", "b"])
    for number in (3, 7):
        source = next(root.glob(f"*/*{number:05d}.png"))
        (root / "a" / f"copy_of_{number}.png").write_bytes(source.read_bytes())
    return root


@pytest.fixture
def small_code():
    """Builds an instance code on 16 × 16 pictures: `(num_blocks=4,
    block_size=16, seed=0)`."""
    return _small_code
