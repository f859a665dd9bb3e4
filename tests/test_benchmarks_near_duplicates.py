"""benchmarks/near_duplicates.py: a warm restart from a saved instance code."""

import argparse

import keras
import numpy as np
import pytest

from benchmarks import near_duplicates
from subic_keras.instance import instance_code as instance


def test_start_from_goes_on_training_that_code_under_its_own_cache_key(tmp_path):
    backbone = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
        ]
    )
    start = instance.build_instance_subic(backbone, 2, 16)
    start.save(tmp_path / "start.keras", include_optimizer=False)
    pictures = np.random.default_rng(0).integers(0, 256, (16, 16, 16, 3), np.uint8)
    args = argparse.Namespace(
        epochs=1, batch_size=8, seed=0, num_blocks=2, block_size=16, width=1,
        start_from=str(tmp_path / "start.keras"), cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    code, seconds = near_duplicates.trained(args, pictures)
    assert seconds is not None and (code.num_blocks, code.block_size) == (2, 16)
    before, after = (
        start.model.get_layer("fc0").get_weights()[0],
        code.model.get_layer("fc0").get_weights()[0],
    )
    assert not np.allclose(before, after)  # trained on, from those weights
    assert np.abs(after - before).max() < 0.1  # an epoch of two steps from them
    # Cached: the same start reads it back; another start trains anew.
    again, seconds = near_duplicates.trained(args, pictures)
    assert seconds is not None  # its training time, recorded beside it
    np.testing.assert_array_equal(again.model.get_layer("fc0").get_weights()[0], after)
    code.save(tmp_path / "other.keras", include_optimizer=False)
    args.start_from = str(tmp_path / "other.keras")
    near_duplicates.trained(args, pictures)
    assert len(list((tmp_path / "cache").glob("*.keras"))) == 2


def test_network_outputs_rank_alike_up_to_a_constant_of_each_block():
    rng = np.random.default_rng(0)
    items = rng.normal(size=(50, 4 * 8)).astype(np.float32)
    # A block's outputs are log-probabilities up to a constant of the block:
    # item 7 shifted block by block is still item 7, first.
    shifts = np.repeat(rng.normal(scale=20.0, size=(1, 4)), 8, axis=1)
    query = items[7:8] + shifts
    ranked = near_duplicates.cosine_ranked(
        near_duplicates.centred_outputs(items, 8),
        near_duplicates.centred_outputs(query, 8),
        3,
    )
    assert ranked.shape == (1, 3) and ranked[0, 0] == 7
    # Unit rows: the plain cosine of uncentred outputs would not find it.
    plain = items / np.linalg.norm(items, axis=1, keepdims=True)
    moved = query / np.linalg.norm(query)
    assert near_duplicates.cosine_ranked(plain, moved, 1)[0, 0] != 7


def test_the_feature_peer_is_the_data_directorys_extractor_where_it_is(tmp_path):
    args = argparse.Namespace(extractor=None, data_dir=None)
    assert near_duplicates.extractor_path(args) is None
    args.data_dir = str(tmp_path)
    assert near_duplicates.extractor_path(args) is None  # not there
    path = tmp_path / near_duplicates.EXTRACTOR
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    assert near_duplicates.extractor_path(args) == str(path)
    args.extractor = "other.tflite"
    assert near_duplicates.extractor_path(args) == "other.tflite"


def test_a_missing_extractor_is_refused_before_any_training(capsys):
    with pytest.raises(SystemExit) as stop:
        near_duplicates.parse_args(["--data-dir", "d", "--extractor", "no.tflite"])
    assert stop.value.code == 2
    assert "--extractor must be a LiteRT file, received 'no.tflite'" in (
        capsys.readouterr().err
    )
