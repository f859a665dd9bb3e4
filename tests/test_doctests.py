"""The docstring examples of the library run, and show what they print."""

import doctest
import importlib
import tempfile

import numpy as np
import pytest

# Modules whose every example runs, with `NAMESPACE` below.
MODULES = (
    "subic_keras.baselines.dlbhc",
    "subic_keras.baselines.dsh",
    "subic_keras.baselines.hashing",
    "subic_keras.baselines.quantizers",
    "subic_keras.baselines.uncompressed",
    "subic_keras.baselines.one_hot",
    "subic_keras.models.applications",
    "subic_keras.models.backbones",
    "subic_keras.models.building",
    "subic_keras.evaluation.code_scores",
    "subic_keras.data.datasets",
    "subic_keras.models.litert_features",
    "subic_keras.data.pipelines",
    "subic_keras.data.preprocessing",
    "subic_keras.trainers.pretraining",
    "subic_keras.trainers.callbacks",
    "subic_keras.trainers.recipe",
    "subic_keras.baselines.training",
    "subic_keras.serving.export",
    "subic_keras.models.litert",
    "subic_keras.models.losses",
    "subic_keras.models.subic",
    "subic_keras.data.protocols",
    "subic_keras.evaluation.retrieval_metrics",
    "subic_keras.models.layers",
    "subic_keras.models.metrics",
    "subic_keras.evaluation.scoring",
    "subic_keras.data.images",
    "subic_keras.search.base",
    "subic_keras.search.checks",
    "subic_keras.search.filters",
    "subic_keras.search.uri",
    "subic_keras.search.image_index",
    "subic_keras.search.sharding",
    "subic_keras.search.manifests",
    "subic_keras.search.native",
    "subic_keras.models.weights_digest",
    "subic_keras.search.subic_index",
    "subic_keras.search.packing",
    "subic_keras.search.milvus",
    "subic_keras.search.milvus_pictures",
    "subic_keras.instance.near_duplicates",
    "subic_keras.instance.alterations",
    "subic_keras.instance.instance_code",
    "subic_keras.instance.copies",
    "subic_keras.instance.picture_views",
    "subic_keras.data.pixels",
    "subic_keras.prebuild",
    "subic_keras.models.prediction",
    "subic_keras.search.copy_rules",
    "subic_keras.data.folders",
    "subic_keras.data.streams",
    "subic_keras.models.mobilenet",
    "subic_keras.trainers.resuming",
)


def namespace() -> dict:
    """What every example may use: NumPy, Keras, and 64 small RGB images
    (uint8, CIFAR-10's shape) with class ids, as a user's data would be."""
    import keras

    from subic_keras.evaluation import retrieval_metrics as evaluation
    from subic_keras.models import backbones
    from subic_keras.models.building import build_subic
    from subic_keras.trainers.recipe import Recipe

    rng = np.random.default_rng(0)
    return {
        "np": np,
        "keras": keras,
        "backbones": backbones,
        "evaluation": evaluation,
        "build_subic": build_subic,
        "Recipe": Recipe,
        "images": rng.integers(0, 256, size=(64, 32, 32, 3), dtype=np.uint8),
        "labels": rng.integers(0, 10, size=64),
    }


# Examples that read the official files from `data/` (the layout the loaders
# document), linked to the offline data directory.
NEEDS_DATA = (
    "subic_keras.data.datasets",
    "subic_keras.models.litert_features",
    "subic_keras.models.mobilenet",
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch, request):
    if name.startswith("subic_keras.search.milvus"):
        pytest.importorskip("pymilvus", reason="the [milvus] extra")
    module = importlib.import_module(name)
    monkeypatch.chdir(tmp_path)  # examples that save a model write here
    # Examples make folders as a user would (`tempfile.mkdtemp()`) and leave
    # them; here they go into the test's folder, not the machine's /tmp.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    if name in NEEDS_DATA:
        (tmp_path / "data").symlink_to(request.getfixturevalue("shared_data_dir"))
    result = doctest.testmod(
        module,
        extraglobs=namespace(),
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        report=True,
    )
    assert result.attempted > 0, f"{name} has no docstring example"
    assert result.failed == 0, f"{result.failed} docstring examples of {name} failed"


def test_numpy_only_modules_do_not_import_tensorflow():
    import subprocess
    import sys

    code = (
        "import sys, subic_keras.evaluation.retrieval_metrics, "
        "subic_keras.data.protocols, subic_keras.evaluation.scoring, "
        "subic_keras.search, subic_keras.baselines.quantizers, "
        "subic_keras.baselines.uncompressed, subic_keras.config, subic_keras.cli, "
        "subic_keras.search.milvus, subic_keras.search.milvus_pictures, "
        "subic_keras.evaluation, subic_keras.protocols, subic_keras.scoring; "
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules; "
        "assert 'pymilvus' not in sys.modules  # loaded by MilvusIndex() only"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
