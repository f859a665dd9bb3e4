"""`subic_keras.training`: the configuration behind `subic train`."""

import os

import numpy as np
import pytest

from subic_keras.trainers.recipe import Recipe
from subic_keras.training import TrainConfig, standardization


def test_defaults_are_the_recipe():
    recipe = TrainConfig().recipe()
    default = Recipe()
    assert (recipe.gamma, recipe.mu, recipe.epochs, recipe.pretrain_epochs) == (
        default.gamma,
        default.mu,
        default.epochs,
        default.pretrain_epochs,
    )
    assert recipe.warmup_fraction == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dataset": "mnist"}, "dataset must be one of"),
        ({"backbone": "vgg"}, "backbone must be one of"),
        ({"block_size": 1}, "block_size"),
        ({"epochs": 3, "warmup_epochs": 4}, "warmup_epochs must be at most epochs"),
        ({"max_train_images": 1}, "max_train_images must be >= 2, received 1"),
        ({"learning_rate": 0.0}, "learning_rate must be > 0"),
        ({"exclude_classes": (2, 2)}, "exclude_classes must name each class once"),
        ({"exclude_classes": (-1,)}, "exclude_classes must be >= 0, received -1"),
        (
            {"images": "photos", "exclude_classes": (1,)},
            "exclude_classes applies to dataset",
        ),
    ],
)
def test_bad_configuration_names_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


def test_standardization_uses_channel_statistics():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(20, 4, 4, 3), dtype=np.uint8)
    layer = standardization(images)
    out = np.asarray(layer(images.astype("float32") / 255))
    np.testing.assert_allclose(out.mean(axis=(0, 1, 2)), 0.0, atol=1e-4)
    np.testing.assert_allclose(out.std(axis=(0, 1, 2)), 1.0, atol=1e-3)


def test_a_pretrained_backbone_is_frozen_for_a_fifth_of_the_pretraining():
    pretrained = TrainConfig(backbone="mobilenet_v3_small", weights="imagenet")
    assert pretrained.recipe().frozen_epochs == 20
    assert TrainConfig(backbone="resnet50", weights=None).recipe().frozen_epochs == 0
    assert (
        TrainConfig(pretrain_epochs=3, backbone="resnet50").recipe().frozen_epochs == 1
    )
    assert (
        TrainConfig(pretrain_epochs=0, backbone="resnet50").recipe().frozen_epochs == 0
    )
    assert TrainConfig(frozen_epochs=4).recipe().frozen_epochs == 4
    with pytest.raises(ValueError, match="frozen_epochs must be at most pretrain"):
        TrainConfig(pretrain_epochs=2, frozen_epochs=3)


def test_mixed_precision_trains_and_saves_a_float32_model(tmp_path):
    import keras

    from subic_keras.serving.export import load_subic
    from subic_keras.training import train

    config = TrainConfig(
        dataset="digits",
        pretrain_epochs=1,
        epochs=1,
        mixed_precision=True,
        max_train_images=300,
        output_dir=str(tmp_path),
        cache_dir=str(tmp_path / "cache"),
    )
    summary = train(config, verbose=0)
    assert keras.mixed_precision.global_policy().name == "float32"
    assert summary["best_epoch"] == 1 and summary["test"]["accuracy_soft"] > 0.2
    subic = load_subic(summary["checkpoint"])
    policies = {
        layer.dtype_policy.name for layer in subic.train_model._flatten_layers()
    }
    assert policies == {"float32"}
    assert subic.query_encoder.output.dtype == "float32"


def test_a_small_folder_holds_out_the_20_pictures_selection_needs(tmp_path):
    from subic_keras.data.images import write_image_folder
    from subic_keras.training import _folder_validation_size

    write_image_folder(np.zeros((120, 8, 8, 3), np.uint8), np.arange(120) % 3, tmp_path)
    assert _folder_validation_size(TrainConfig(images=str(tmp_path))) == 20
    assert (
        _folder_validation_size(TrainConfig(images=str(tmp_path), validation_size=30))
        == 30
    )
    write_image_folder(
        np.zeros((300, 8, 8, 3), np.uint8), np.arange(300) % 3, tmp_path / "big"
    )
    assert _folder_validation_size(TrainConfig(images=str(tmp_path / "big"))) == 0.1


def test_no_output_is_written_through_a_planted_link(tmp_path):
    from swapping import outside_folder

    from subic_keras.training import train

    outside = outside_folder(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").symlink_to(outside / "victim")
    (out / "best.keras").symlink_to(outside / "new.keras")  # dangling
    (out / "logs").symlink_to(outside)
    config = TrainConfig(
        dataset="digits",
        pretrain_epochs=1,
        epochs=1,
        max_train_images=300,
        output_dir=str(out),
        cache_dir=str(tmp_path / "cache"),
    )
    # Refused before any training; then, replacing them, the links go
    # themselves and every output lands in the output folder.
    with pytest.raises(FileExistsError, match="a symbolic link"):
        train(config, verbose=0)
    assert not (tmp_path / "cache").exists()
    summary = train(config, verbose=0, overwrite=True)
    assert summary["checkpoint"] == str(out / "best.keras")
    for name in ("summary.json", "best.keras", "logs"):
        assert not (out / name).is_symlink()
    assert sorted(os.listdir(out / "logs" / "subic")) == ["train", "validation"]
    assert os.listdir(outside) == ["victim"]
    assert (outside / "victim").read_text() == "the user's"


def test_held_out_classes_never_reach_training():
    """`exclude_classes`: no picture of a held-out class is trained or
    validated on; the others are numbered in order, the model records which
    were held out."""
    from subic_keras.data import datasets
    from subic_keras.training import _data, _data_source

    config = TrainConfig(dataset="digits", exclude_classes=(6, 2, 4))
    assert config.exclude_classes == (2, 4, 6)
    data = _data(config)
    x_fit, y_fit, x_val, y_val, x_test, y_test = data.splits
    (x_train, y_train), (_, y_all_test) = datasets.load_digits()
    held = {image.tobytes() for image in x_train[np.isin(y_train, (2, 4, 6))]}
    seen = {image.tobytes() for image in x_train[~np.isin(y_train, (2, 4, 6))]}
    assert held and not held & seen  # (no picture is in two classes)
    for images in (x_fit, x_val):
        assert not {image.tobytes() for image in images} & held
    assert len(x_fit) + len(x_val) == len(seen)
    assert data.num_classes == 7 and data.class_names == list("0135789")
    for labels in (y_fit, y_val, y_test):
        assert set(labels.tolist()) == set(range(7))
    assert len(x_test) == np.isin(y_all_test, (2, 4, 6), invert=True).sum()
    assert _data_source(config)["held_out_classes"] == "2,4,6"
    with pytest.raises(ValueError, match="must leave at least 2 of the 10 classes"):
        _data(TrainConfig(dataset="digits", exclude_classes=tuple(range(9))))
    with pytest.raises(ValueError, match=r"class ids below 10 .*, received \[2, 12\]"):
        _data(TrainConfig(dataset="digits", exclude_classes=(12, 2)))


def test_a_baseline_shares_subics_data_and_pretraining(tmp_path):
    """`train_baseline`: the SuBiC run's splits and its cached stage 1, then
    the baseline's own loss at SuBiC's code length."""
    from subic_keras.baselines import DSH
    from subic_keras.training import train, train_baseline

    config = TrainConfig(
        dataset="digits",
        exclude_classes=(2, 4, 6),
        num_blocks=4,
        block_size=8,
        pretrain_epochs=1,
        epochs=1,
        output_dir=str(tmp_path / "subic"),
        cache_dir=str(tmp_path / "cache"),
    )
    subic_summary = train(config, verbose=0)
    dsh, summary = train_baseline(config, "dsh")
    assert isinstance(dsh, DSH)
    assert summary["bits"] == 12 and summary["method"] == "dsh"
    assert summary["pretraining"]["cached"]
    assert summary["pretraining"]["key"] == subic_summary["pretrain"]["key"]
    assert summary["num_train"] == subic_summary["num_train"]
    assert summary["epochs_run"] == 1 and summary["best_epoch"] == 1
    assert dsh.encode(np.zeros((3, 8, 8, 1), np.uint8)).shape == (3, 12)
    with pytest.raises(ValueError, match=r"method must be one of .*received 'pq'"):
        train_baseline(config, "pq")
