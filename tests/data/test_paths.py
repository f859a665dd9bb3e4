"""Tests for subic_keras.data.paths: walking a folder once, opening files inside it."""

import os
import time

import pytest
from swapping import link_swapped

from subic_keras.data import paths


def test_find_files_skips_hidden_names_links_out_and_special_files(tmp_path):
    root = tmp_path / "photos"
    (root / "a" / "b").mkdir(parents=True)
    (root / ".cache").mkdir()
    for name in ("x.png", "a/y.jpg", "a/b/z.txt", ".hidden.png", ".cache/w.png"):
        (root / name).write_bytes(b"data")
    outside = tmp_path / "secret.png"
    outside.write_bytes(b"secret")
    (root / "a" / "out.png").symlink_to(outside)
    (root / "a" / "dangling.png").symlink_to(tmp_path / "gone.png")
    (root / "outdir").symlink_to(tmp_path)
    (root / "loop").symlink_to("loop")
    os.mkfifo(root / "fifo.png")
    open(os.fsencode(root) + b"/caf\xe9.png", "wb").close()  # Latin-1 name
    found, skipped = paths.find_files(root)
    assert found == ["a/b/z.txt", "a/y.jpg", "x.png"]
    assert {(s.path, s.reason) for s in skipped} == {
        ("a/out.png", "link out of the folder"),
        ("a/dangling.png", "link to nothing"),
        ("outdir", "link out of the folder"),
        ("loop", "a loop of links"),
        ("fifo.png", "not a regular file (a FIFO, socket or device)"),
        (repr("caf\udce9.png"), "name is not UTF-8"),
    }
    with pytest.raises(NotADirectoryError):
        paths.find_files(root / "x.png")
    with pytest.raises(FileNotFoundError, match="image folder not found"):
        paths.find_files(tmp_path / "missing")


def test_each_real_file_is_found_once_whatever_links_lead_to_it(tmp_path):
    root = tmp_path / "photos"
    (root / "cats").mkdir(parents=True)
    (root / "cats" / "tom.png").write_bytes(b"tom")
    (root / "self").symlink_to(".")  # a loop through the top folder
    (root / "cats" / "up").symlink_to("..")
    (root / "cats" / "again.png").symlink_to("tom.png")
    os.link(root / "cats" / "tom.png", root / "hard.png")
    (root / "pets").symlink_to("cats")  # the same folder under another name
    start = time.perf_counter()
    found, skipped = paths.find_files(root)
    assert time.perf_counter() - start < 5
    # The real paths win over links; a hard link is the same file too.
    assert found == ["cats/tom.png"]
    reasons = {s.path: s.reason for s in skipped}
    assert reasons == {
        "cats/again.png": "the same file as cats/tom.png",
        "hard.png": "the same file as cats/tom.png",
        "cats/up": "a folder already walked",
        "pets": "a folder already walked",
        "self": "a folder already walked",
    }


def test_three_self_links_end_at_once(tmp_path):
    root = tmp_path / "photos"
    root.mkdir()
    for i in range(23):
        (root / f"p{i:02d}.png").write_bytes(bytes([i]))
    for name in ("s1", "s2", "s3"):
        (root / name).symlink_to(".")
    found, skipped = paths.find_files(root)
    assert len(found) == 23 and len(skipped) == 3


def test_a_folder_followed_by_a_link_inside_is_walked_once(tmp_path):
    root = tmp_path / "photos"
    (root / "real").mkdir(parents=True)
    (root / "real" / "x.png").write_bytes(b"x")
    (root / "alias").symlink_to(root / "real")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "y.png").write_bytes(b"y")
    (root / "inner").symlink_to(root / "real" / "x.png")
    found, _ = paths.find_files(root)
    assert found == ["real/x.png"]


def test_resolve_refuses_every_way_out(tmp_path):
    root = tmp_path / "photos"
    root.mkdir()
    (root / "x.png").write_bytes(b"data")
    (tmp_path / "secret.png").write_bytes(b"secret")
    (root / "link.png").symlink_to(tmp_path / "secret.png")
    assert paths.resolve(root, "x.png") == str((root / "x.png").resolve())
    for bad in ("../secret.png", "/etc/passwd", "a/../../secret.png", "link.png", ""):
        with pytest.raises(PermissionError):
            paths.resolve(root, bad)
    with pytest.raises(FileNotFoundError):
        paths.resolve(root, "gone.png")


@pytest.mark.parametrize("follow", [True, False])
def test_open_in_folder_reads_only_inside(tmp_path, follow):
    root = tmp_path / "photos"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "x.png").write_bytes(b"inside")
    (root / "in.png").symlink_to(root / "sub" / "x.png")
    (tmp_path / "secret").write_bytes(b"secret")
    (root / "out.png").symlink_to(tmp_path / "secret")
    (root / "outdir").symlink_to(tmp_path)
    os.mkfifo(root / "fifo.png")
    real = os.path.realpath(root)

    def read(relative):
        with open(paths.open_in_folder(real, relative, follow=follow), "rb") as f:
            return f.read()

    assert read("sub/x.png") == b"inside"
    if follow:
        assert read("in.png") == b"inside"
    else:
        with pytest.raises(PermissionError):
            read("in.png")
    for bad in ("out.png", "outdir/secret", "../secret", "/etc/passwd", "a\0b"):
        with pytest.raises(PermissionError):
            read(bad)
    start = time.perf_counter()
    with pytest.raises(OSError, match="not a regular file"):
        read("fifo.png")  # refused at once, never blocks
    assert time.perf_counter() - start < 1
    with pytest.raises(FileNotFoundError):
        read("gone.png")


def test_open_regular_refuses_what_is_not_a_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    for path in (tmp_path / "fifo", "/dev/null", tmp_path):
        with pytest.raises(OSError):
            os.close(paths.open_regular(path))


@pytest.mark.parametrize("follow", [True, False])
def test_a_link_swapped_in_and_out_never_opens_an_outside_file(tmp_path, follow):
    """A file of the folder swapped between itself and a link out of the
    folder, as fast as possible, while it is opened 3,000 times: no outside
    byte is ever read."""
    root = tmp_path / "photos"
    root.mkdir()
    inside = b"inside" * 100
    (root / "keep.png").write_bytes(inside)
    secret = tmp_path / "secret"
    secret.write_bytes(b"SECRET" * 100)
    target = root / "x.png"
    real = os.path.realpath(root)
    outcomes = {"read": 0, "refused": 0}
    with link_swapped(target, inside, secret):
        for _ in range(3000):
            try:
                fd = paths.open_in_folder(real, "x.png", follow=follow)
            except (PermissionError, FileNotFoundError):
                outcomes["refused"] += 1
                continue
            with open(fd, "rb") as f:
                data = f.read()
            assert b"SECRET" not in data
            outcomes["read"] += 1
    assert outcomes["read"] > 0 and outcomes["refused"] > 0, outcomes


def test_a_folder_hundreds_deep_is_walked_without_recursion(tmp_path):
    import sys

    depth = 600  # (pytest removes its temporary folders recursively)
    deepest = os.path.join(tmp_path, *["d"] * depth)
    os.makedirs(deepest)
    with open(os.path.join(deepest, "x.png"), "wb"):
        pass
    (tmp_path / "d" / "up").symlink_to("d")  # followed afterwards, inside
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        found, skipped = paths.find_files(tmp_path)
    finally:
        sys.setrecursionlimit(limit)
    assert found == ["/".join(["d"] * depth + ["x.png"])]
    assert [s.reason for s in skipped] == ["a folder already walked"]
