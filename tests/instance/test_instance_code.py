"""`subic_keras.instance.instance_code`: instance codes trained on altered copies."""

import keras
import numpy as np
import pytest

from subic_keras.instance import instance_code as instance
from subic_keras.models import losses


def _tiny_backbone():
    return keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
        ]
    )


@pytest.fixture(scope="module")
def pictures():
    rng = np.random.default_rng(0)
    return (
        rng.integers(0, 256, (40, 4, 4, 3)).repeat(4, 1).repeat(4, 2).astype(np.uint8)
    )


def test_copy_batches_pair_two_copies_of_each_picture(pictures):
    data = instance.copy_batches(pictures, 8, seed=1, repeat=False)
    batches = list(data.as_numpy_iterator())
    assert len(batches) == 5
    copies, targets = batches[0]
    assert copies.shape == (16, 16, 16, 3) and targets.shape == (16,)
    # Copy i and copy 8 + i come from one picture: closer to each other
    # than to the other pictures' copies, on average.
    flat = copies.reshape(16, -1)
    distances = ((flat[:8, None] - flat[None, 8:]) ** 2).mean(-1)
    assert np.diag(distances).mean() < distances.mean()
    with pytest.raises(ValueError, match="batch_size must be at most"):
        instance.copy_batches(pictures[:4], 8)


def test_a_trained_instance_code_encodes_queries_and_round_trips(pictures, tmp_path):
    code = instance.build_instance_subic(_tiny_backbone(), 2, 16)
    history = instance.train_instance(
        code, pictures, epochs=2, batch_size=8, steps_per_epoch=2, verbose=0
    )
    assert np.isfinite(history.history["loss"]).all()
    assert code.bits == 8
    codes, queries = code.encode(pictures), code.query(pictures)
    assert codes.shape == (40, 2) and codes.dtype == np.int32 and codes.max() < 16
    assert queries.shape == (40, 32)
    # The queries are FC0's outputs: their block softmax is `z*`, whose
    # largest entry in each block is the code's.
    blocks = queries.reshape(40, 2, 16)
    z_star = np.exp(blocks - blocks.max(-1, keepdims=True))
    z_star /= z_star.sum(-1, keepdims=True)
    probs = code.block_probabilities(pictures)
    np.testing.assert_allclose(z_star.reshape(40, 32), probs, atol=1e-5)
    np.testing.assert_array_equal(codes, probs.reshape(40, 2, 16).argmax(-1))
    np.testing.assert_array_equal(codes, blocks.argmax(-1))  # (`copies.calibrate`)
    code.save(tmp_path / "instance.keras")
    loaded = instance.InstanceSubic.load(tmp_path / "instance.keras")
    np.testing.assert_array_equal(loaded.encode(pictures), codes)
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    other.save(tmp_path / "other.keras")
    with pytest.raises(ValueError, match="not an instance code's model"):
        instance.InstanceSubic.load(tmp_path / "other.keras")


def test_the_loss_prefers_copies_that_share_their_code():
    loss = losses.InstanceContrastiveLoss(2, 4, temperature=0.1)
    a, b = [1, 0, 0, 0, 0, 1, 0, 0], [0, 0, 1, 0, 0, 0, 0, 1]
    paired = np.array([a, b, a, b], "float32")
    swapped = np.array([a, b, b, a], "float32")
    assert float(loss(None, paired)) < float(loss(None, swapped))
    config = loss.get_config()
    assert config["feature_weight"] == 1.0 and config["temperature"] == 0.1
    assert (
        losses.InstanceContrastiveLoss(
            **{
                k: v
                for k, v in config.items()
                if k not in ("name", "reduction", "dtype")
            }
        ).temperature
        == 0.1
    )
    with pytest.raises(ValueError, match="temperature must be > 0"):
        losses.InstanceContrastiveLoss(2, 4, temperature=0.0)


def test_copy_margins_are_checked_and_the_earlier_ratio_rule_is_dropped():
    inputs = keras.Input((3,))
    model = instance.InstanceModel(inputs, keras.layers.Dense(4)(inputs))
    config = model.get_config()
    assert config["copy_margin"] is None
    for bad in (0.5, float("-inf"), float("nan"), True, "-1"):
        with pytest.raises(ValueError, match="copy_margin must be <= 0"):
            instance.InstanceModel.from_config({**config, "copy_margin": bad})
    # A model saved with the rule on z* (a ratio in [0, 1]) loads without it.
    earlier = {k: v for k, v in config.items() if k != "copy_margin"}
    loaded = instance.InstanceModel.from_config({**earlier, "copy_threshold": 0.9})
    assert loaded.copy_margin is None
    kept = instance.InstanceModel.from_config({**config, "copy_margin": -3})
    assert kept.copy_margin == -3


def test_copy_batches_write_no_autograph_source_file(pictures, tmp_path, monkeypatch):
    import tempfile

    # AutoGraph writes each function it converts to a file in the temporary
    # folder, removed only at a clean exit; the copies need no conversion.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    data = instance.copy_batches(pictures, 8, seed=5, repeat=False)
    images, _ = next(iter(data))
    assert images.shape[0] == 16
    assert list(tmp_path.iterdir()) == []
