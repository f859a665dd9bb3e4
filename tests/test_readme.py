"""The README's Keras snippets run as written (on a small slice of CIFAR-10)."""

import re
from pathlib import Path

import numpy as np
import pytest

import subic_keras as sk

README = Path(__file__).resolve().parents[1] / "README.md"


def _keras_snippets() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Using it from Keras") : text.index("## Command line")]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.mark.slow
def test_keras_snippets_run_as_written(shared_data_dir, tmp_path, monkeypatch):
    full = sk.datasets.load_cifar10

    def small_cifar10(data_dir, **kwargs):
        assert data_dir == "data"  # the snippet names the user's directory
        (x, y), test = full(shared_data_dir, max_per_split=1100)
        return (x[:300], y[:300]), test

    monkeypatch.setattr(sk.datasets, "load_cifar10", small_cifar10)
    monkeypatch.chdir(tmp_path)
    snippets = _keras_snippets()
    assert len(snippets) == 2
    namespace: dict = {}
    exec(snippets[0], namespace)
    summary, subic = namespace["summary"], namespace["subic"]
    assert summary["pretrain"]["epochs"] == 50 and summary["recipe"]["epochs"] == 5
    assert namespace["codes"].shape == (100, 8)
    assert namespace["ids"].shape == (1000, 100)
    assert (tmp_path / "subic48.keras").is_file()
    assert list((tmp_path / "subic_cache").glob("pretrain-*.weights.h5"))
    assert subic.default_query == summary["query"]
    # The codes are not collapsed onto one code.
    assert len(np.unique(namespace["codes"], axis=0)) > 1

    exec(snippets[1], namespace)
    history = namespace["subic"].train_model.history.history
    assert len(history["val_map_fc0"]) == 5


def test_milvus_snippet_runs_as_written(tmp_path, monkeypatch):
    pytest.importorskip("pymilvus", reason="the [milvus] extra")
    import keras

    text = README.read_text()
    section = text[
        text.index("## Beyond one machine: Milvus") : text.index("## Deploying")
    ]
    (snippet,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    backbone = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten()])
    images = np.random.default_rng(0).integers(0, 256, (50, 8, 8, 3), dtype=np.uint8)
    namespace = {
        "subic": sk.build_subic(backbone, 8, 64, num_classes=3, input_shape=(8, 8, 3)),
        "images": images,
        "image_ids": np.arange(50) * 3,
        "query_images": images[:4],
    }
    monkeypatch.chdir(tmp_path)
    exec(snippet, namespace)
    assert namespace["ids"].shape == (4, 50)
    assert set(namespace["ids"][0]) <= set(range(0, 150, 3)) | {-1}
    namespace["index"].close()


def test_folder_snippet_runs_as_written(tmp_path, monkeypatch):
    text = README.read_text()
    section = text[
        text.index("## Train on your own pictures") : text.index("## Inputs and errors")
    ]
    (snippet,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    rng = np.random.default_rng(0)
    labels = np.arange(600) % 3
    pictures = rng.integers(0, 256, (600, 40, 30, 3), dtype=np.uint8)
    pictures[..., 0] = (labels * 100)[:, None, None].astype(np.uint8)
    sk.images.write_image_folder(pictures, labels, tmp_path / "photos")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(snippet, namespace)
    assert namespace["folder"].class_names == ["0", "1", "2"]
    assert namespace["summary"]["num_classes"] == 3
    assert namespace["subic"].encode(namespace["folder"].validation).shape == (60, 8)
    assert 0 <= namespace["result"]["map"] <= 1
