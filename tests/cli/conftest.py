"""Fixtures of the command-line tests: a saved model and a folder of
pictures with things in it that are not."""

import pytest
from served import picture_folder, save_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("model") / "model.keras")


@pytest.fixture
def folder(tmp_path):
    """24 pictures, 3 files that are not pictures and a link out of the folder."""
    root = tmp_path / "photos"
    paths = picture_folder(root, n=24)
    (root / "notes.txt").write_text("not a picture")
    broken = (root / paths[0]).read_bytes()[:100]
    (root / "c" / "broken.png").write_bytes(broken)
    (root / "empty.jpg").write_bytes(b"")
    (tmp_path / "outside.png").write_bytes((root / paths[1]).read_bytes())
    (root / "a" / "link.png").symlink_to(tmp_path / "outside.png")
    return root, paths
