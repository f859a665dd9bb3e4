"""The modules of earlier releases import as the modules they are now, and
the subpackages named as earlier modules answer for those modules' names."""

import importlib

import pytest

import subic_keras
from subic_keras._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_earlier_module_name_imports_the_module_itself(old):
    now = importlib.import_module(f"subic_keras.{MOVED[old]}")
    assert importlib.import_module(f"subic_keras.{old}") is now
    assert now.__name__ == now.__spec__.name == f"subic_keras.{MOVED[old]}"
    assert getattr(subic_keras, old) is now


def test_earlier_imports_and_attributes_keep_working():
    from subic_keras.export import load_subic
    from subic_keras.recipe import learning_rate_schedule, train_subic
    from subic_keras.training import standardization

    assert train_subic.__module__ == "subic_keras.trainers.recipe"
    assert load_subic.__module__ == "subic_keras.serving.export"
    assert callable(learning_rate_schedule) and callable(standardization)
    # Subpackages named as the modules they replace hand on those names.
    assert subic_keras.models.Subic is subic_keras.Subic
    assert subic_keras.instance.InstanceSubic is subic_keras.InstanceSubic
    folder_training = importlib.import_module("subic_keras.instance.folder_training")
    assert subic_keras.instance.train_on_folder is folder_training.train_on_folder
    assert "train_on_folder" in dir(subic_keras.instance)
    evaluation = importlib.import_module("subic_keras.evaluation.retrieval_metrics")
    assert subic_keras.evaluation.mean_average_precision is (
        evaluation.mean_average_precision
    )
    assert "mean_average_precision" in dir(subic_keras.evaluation)
    # Their submodules load by name, without the re-exported module.
    assert subic_keras.models.weights_digest.__name__ == (
        "subic_keras.models.weights_digest"
    )
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        subic_keras.models.nothing  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("subic_keras.nothing")
