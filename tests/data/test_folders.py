"""`datasets.image_folder`: a labelled folder as streams."""

import os
import time

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from subic_keras.data import datasets, folders, images, streams


def _folder(root, n=24, size=8):
    rng = np.random.default_rng(0)
    pictures = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    labels = np.arange(n) % 3
    images.write_image_folder(pictures, labels, root, ["cat", "dog", "eel"])
    return pictures, labels


def _decoded(dataset):
    pairs = list(dataset.as_numpy_iterator())
    return np.stack([p for p, _ in pairs]), np.array([label for _, label in pairs])


def test_streams_give_the_decoder_pixels_and_class_ids(tmp_path):
    pictures, labels = _folder(tmp_path)
    folder = datasets.image_folder(tmp_path, 8, validation_split=6, seed=1)
    assert folder.class_names == ["cat", "dog", "eel"]
    assert len(folder.training_paths) == 18 and len(folder.validation_paths) == 6
    assert not set(folder.training_paths) & set(folder.validation_paths)
    # Validation keeps its order; each picture is the file's pixels.
    val_pixels, val_labels = _decoded(folder.validation)
    for path, pixels, label in zip(folder.validation_paths, val_pixels, val_labels):
        position = int(path.rsplit("_", 1)[1].split(".")[0])
        np.testing.assert_array_equal(pixels, pictures[position])
        assert label == labels[position]
    # Training is reshuffled on every pass, always the same pictures.
    first, second = _decoded(folder.training)[1], _decoded(folder.training)[1]
    assert sorted(first) == sorted(second) and len(first) == 18
    # The check pass's summary is the stream's: no other pass is needed.
    summary = streams.summarize(folder.validation)
    np.testing.assert_array_equal(summary.labels, val_labels)
    np.testing.assert_array_equal(
        datasets.channel_statistics(folder.validation),
        datasets.channel_statistics(val_pixels),
    )


def test_sizes_subsets_and_modes(tmp_path):
    _folder(tmp_path, n=30)
    # Grey, RGBA and 16-bit PNGs join as RGB pictures of the asked size.
    Image.fromarray(np.full((5, 7), 9, np.uint8)).save(tmp_path / "cat" / "grey.png")
    Image.fromarray(np.zeros((6, 6, 4), np.uint8)).save(tmp_path / "dog" / "rgba.png")
    Image.fromarray(np.full((4, 4), 4096, np.uint16)).save(
        tmp_path / "eel" / "deep.png"
    )
    folder = datasets.image_folder(tmp_path, (12, 10), max_images=9, seed=2)
    assert folder.validation is None and len(folder.training_paths) == 9
    pixels, labels = _decoded(folder.training)
    assert pixels.shape == (9, 12, 10, 3) and pixels.dtype == np.uint8
    assert sorted(set(labels.tolist())) == [0, 1, 2]  # the subset keeps classes
    grey = datasets.image_folder(tmp_path, 4, channels=1)
    assert grey.training.element_spec[0].shape == (4, 4, 1)
    assert len(grey.training_paths) == 33


def test_bad_files_are_reported_not_raised(tmp_path):
    _folder(tmp_path)
    (tmp_path / "cat" / "notes.txt").write_text("not a picture")
    (tmp_path / "dog" / "cut.png").write_bytes(
        (tmp_path / "dog" / "dog_00001.png").read_bytes()[:40]
    )
    (tmp_path / "stray.png").write_bytes(b"")
    folder = datasets.image_folder(tmp_path, 8)
    reasons = {s.path: s.reason for s in folder.skipped}
    assert set(reasons) == {"cat/notes.txt", "dog/cut.png", "stray.png"}
    assert reasons["stray.png"] == "not in a class folder"
    assert len(folder.training_paths) == 24
    # A file that breaks after the check: another picture of its class
    # takes its place, with a warning.
    os.remove(tmp_path / "eel" / "eel_00002.png")
    with pytest.warns(UserWarning, match="skipped eel/eel_00002.png"):
        pixels, labels = _decoded(folder.training)
    assert len(pixels) == 24 and np.bincount(labels).tolist() == [8, 8, 8]
    assert "eel/eel_00002.png" in {s.path for s in folder.skipped}
    for path in (tmp_path / "eel").iterdir():
        path.unlink()
    with pytest.warns(UserWarning, match="skipped eel/"):
        with pytest.raises(tf.errors.OpError) as raised:
            _decoded(folder.training)
    # Training turns TensorFlow's error into its one line.
    failure = folders.folder_failure(raised.value)
    assert failure.startswith("no readable picture is left in the class of eel/")
    assert failure.endswith(
        f"(in {tmp_path}): its files were removed or broke during training"
    )
    assert folders.folder_failure(ValueError("other")) is None


def _count_decodes(monkeypatch) -> list:
    """The files decoded from now on, in order (`images.read_image` spied on)."""
    decoded: list = []
    read_image = images.read_image
    monkeypatch.setattr(
        images,
        "read_image",
        lambda *a, **k: decoded.append(a[0]) or read_image(*a, **k),
    )
    return decoded


def test_epochs_read_the_check_s_pixels_and_decode_changed_files_again(
    tmp_path, monkeypatch
):
    pictures, _ = _folder(tmp_path)
    folder = datasets.image_folder(tmp_path, 8, shuffle=False)
    decoded = _count_decodes(monkeypatch)
    first, _ = _decoded(folder.training)
    np.testing.assert_array_equal(_decoded(folder.training)[0], first)
    assert decoded == []  # two epochs, no file decoded
    # A file rewritten with other pixels is decoded again, not read stale.
    changed = folder.training_paths[3]
    Image.fromarray(255 - pictures[0]).save(tmp_path / changed)
    again, _ = _decoded(folder.training)
    assert decoded == [changed]
    np.testing.assert_array_equal(again[3], 255 - pictures[0])
    np.testing.assert_array_equal(np.delete(again, 3, 0), np.delete(first, 3, 0))


def test_a_full_temporary_disk_decodes_every_epoch(tmp_path, monkeypatch):
    _folder(tmp_path)
    monkeypatch.setattr(folders, "_CACHE_SPARE", 1 << 62)
    folder = datasets.image_folder(tmp_path, 8, shuffle=False)
    decoded = _count_decodes(monkeypatch)
    assert len(_decoded(folder.training)[0]) == 24 and len(decoded) == 24


def test_files_that_become_fifos_during_training_are_replaced(tmp_path):
    _folder(tmp_path)
    folder = datasets.image_folder(tmp_path, 8)
    for name in ("cat/cat_00000.png", "dog/dog_00001.png"):
        os.remove(tmp_path / name)
        os.mkfifo(tmp_path / name)
    start = time.perf_counter()
    with pytest.warns(UserWarning, match="not a regular file"):
        pixels, labels = _decoded(folder.training)
    assert time.perf_counter() - start < 30
    assert len(pixels) == 24 and np.bincount(labels).tolist() == [8, 8, 8]


def test_folders_that_cannot_train_are_named(tmp_path):
    with pytest.raises(ValueError, match="at least 2, received 0"):
        datasets.image_folder(tmp_path, 8)
    _folder(tmp_path / "one", n=3)
    for extra in ("dog", "eel"):
        for path in (tmp_path / "one" / extra).iterdir():
            path.unlink()
        (tmp_path / "one" / extra).rmdir()
    with pytest.raises(ValueError, match=r"at least 2, received 1 \(\['cat'\]\)"):
        datasets.image_folder(tmp_path / "one", 8)
    _folder(tmp_path / "broken", n=6)
    for path in (tmp_path / "broken" / "eel").iterdir():
        path.write_text("junk")
    with pytest.raises(ValueError, match=r"without a readable picture: \['eel'\]"):
        datasets.image_folder(tmp_path / "broken", 8)
    with pytest.raises(FileNotFoundError):
        datasets.image_folder(tmp_path / "missing", 8)
    for bad, message in (
        ({"image_size": 0}, "image_size must be >= 1, received 0"),
        ({"image_size": (8, 8, 3)}, "image_size must be a side or"),
        ({"channels": 4}, "channels must be 1 or 3, received 4"),
        ({"validation_split": 1.5}, "validation_split must be a fraction"),
    ):
        with pytest.raises(ValueError, match=message):
            datasets.image_folder(tmp_path / "broken", **{"image_size": 8, **bad})
