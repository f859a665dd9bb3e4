"""What an index file records of its writer: the model and the shard label."""

import numpy as np
import pytest

from subic_keras.search import ImageIndex, SubicIndex

DIGEST = "c" * 64


def test_model_and_shard_label_are_saved_and_read_back(tmp_path):
    codes = SubicIndex(2, 4)
    codes.add([[0, 1], [2, 3]])
    assert codes.file_metadata() == {}
    codes.model = {"digest": DIGEST, "file": "m.keras"}
    codes.shard_label = ["0123abcd", 2]  # as JSON gives it back
    assert codes.shard_label == ("0123abcd", 2)
    codes.save(tmp_path / "codes.subic")
    again = SubicIndex.load(tmp_path / "codes.subic")
    assert again.shard_label == ("0123abcd", 2) and again.model["digest"] == DIGEST
    pictures = ImageIndex(2, 4, root=tmp_path)
    pictures.add([[0, 1]], ["a.png"])
    pictures.shard_label = ("89abcdef", 0)
    pictures.save(tmp_path / "pictures.subic")
    assert ImageIndex.load(tmp_path / "pictures.subic").shard_label == (
        "89abcdef",
        0,
    )


@pytest.mark.parametrize(
    "label",
    [("0123abcd",), ("XYZ01234", 0), ("0123abcd", -1), ("0123abcd", True), "0123abcd"],
)
def test_a_malformed_shard_label_is_refused_naming_it(label):
    with pytest.raises(ValueError, match=r"shard_label must be a \(build, number\)"):
        SubicIndex(2, 4).shard_label = label


def test_a_file_with_a_malformed_label_is_no_index(tmp_path, monkeypatch):
    codes = SubicIndex(2, 4)
    codes.add(np.zeros((1, 2), int))
    monkeypatch.setattr(SubicIndex, "file_metadata", lambda self: {"shard": [1, 2]})
    codes.save(tmp_path / "bad.subic")
    monkeypatch.undo()
    with pytest.raises(ValueError, match="is not a valid SuBiC index file: shard_"):
        SubicIndex.load(tmp_path / "bad.subic")
