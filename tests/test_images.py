"""Tests for subic_keras.images: finding, decoding and writing picture files."""

import io
import os

import numpy as np
import pytest
from PIL import Image

from subic_keras import images


def _encoded(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


@pytest.fixture
def picture():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(40, 60, 3), dtype=np.uint8)


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "GIF", "WEBP", "JPEG"])
def test_every_format_decodes_to_the_model_shape(picture, fmt):
    options = {"lossless": True} if fmt == "WEBP" else {}
    data = _encoded(Image.fromarray(picture), fmt, **options)
    pixels = images.decode_image(data, (32, 32, 3))
    assert pixels.shape == (32, 32, 3) and pixels.dtype == np.uint8
    same_size = images.decode_image(data, (40, 60, 3))
    if fmt in ("PNG", "BMP", "WEBP"):  # lossless: the very pixels
        np.testing.assert_array_equal(same_size, picture)


def test_grey_models_get_one_channel_and_two_d_shapes_none(picture):
    data = _encoded(Image.fromarray(picture), "PNG")
    assert images.decode_image(data, (8, 8, 1)).shape == (8, 8, 1)
    assert images.decode_image(data, (8, 8)).shape == (8, 8)


def test_transparency_is_composited_over_white():
    rgba = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    pixels = images.decode_image(_encoded(rgba, "PNG"), (4, 4, 3))
    assert (pixels == 255).all()
    half = Image.new("LA", (4, 4), (0, 128))
    assert images.decode_image(_encoded(half, "PNG"), (4, 4, 1)).max() == 127


def test_sixteen_bit_png_keeps_its_most_significant_bits():
    values = np.array([[0, 256, 32768, 65535]], dtype=np.uint16)
    data = _encoded(Image.fromarray(values), "PNG")
    pixels = images.decode_image(data, (1, 4, 1))[..., 0]
    assert pixels.tolist() == [[0, 1, 128, 255]]


def test_exif_orientation_is_applied():
    wide = np.zeros((10, 20, 3), np.uint8)
    wide[:, :10, 0] = 255  # left half red, right half blue
    wide[:, 10:, 2] = 255
    stored = Image.fromarray(wide)
    exif = stored.getexif()
    exif[0x0112] = 6  # shown rotated 90° clockwise: the left half on top
    pixels = images.decode_image(_encoded(stored, "PNG", exif=exif), (20, 10, 3))
    assert pixels[:8, :, 0].min() == 255 and pixels[12:, :, 2].min() == 255


def test_large_jpeg_decodes_close_to_a_full_decode(picture):
    big = Image.fromarray(picture).resize((1200, 800))
    data = _encoded(big, "JPEG", quality=95)
    fast = images.decode_image(data, (32, 32, 3)).astype(int)
    with Image.open(io.BytesIO(data)) as full:
        reference = np.asarray(full.convert("RGB").resize((32, 32), Image.BILINEAR))
    assert np.abs(fast - reference.astype(int)).mean() < 3


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "not an image"),
        (b"hello, world", "not an image"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, None),
    ],
)
def test_what_is_not_a_picture_is_a_clear_error(data, message):
    with pytest.raises(images.ImageDecodeError, match=message):
        images.decode_image(data, (8, 8, 3))


def test_truncated_and_bomb_pictures_are_refused(picture, monkeypatch):
    data = _encoded(Image.fromarray(picture), "PNG")
    with pytest.raises(images.ImageDecodeError, match="truncated"):
        images.decode_image(data[: len(data) // 2], (8, 8, 3))
    monkeypatch.setattr(images, "MAX_PIXELS", 100)
    with pytest.raises(images.ImageDecodeError, match="too large"):
        images.decode_image(data, (8, 8, 3))


def test_bad_shape_names_the_argument(picture):
    data = _encoded(Image.fromarray(picture), "PNG")
    with pytest.raises(ValueError, match=r"shape must be .* received \(8, 8, 2\)"):
        images.decode_image(data, (8, 8, 2))


def test_fingerprint_tells_pictures_apart(picture):
    assert images.fingerprint(picture) == images.fingerprint(picture.copy())
    other = picture.copy()
    other[0, 0, 0] ^= 1
    assert images.fingerprint(other) != images.fingerprint(picture)
    assert images.fingerprint(picture[:, :, :1]) != images.fingerprint(picture[:, :, 0])


def test_find_files_skips_hidden_names_and_links_out_of_the_folder(tmp_path):
    root = tmp_path / "photos"
    (root / "a" / "b").mkdir(parents=True)
    (root / ".cache").mkdir()
    for name in ("x.png", "a/y.jpg", "a/b/z.txt", ".hidden.png", ".cache/w.png"):
        (root / name).write_bytes(b"data")
    outside = tmp_path / "secret.png"
    outside.write_bytes(b"secret")
    (root / "a" / "out.png").symlink_to(outside)
    (root / "a" / "dangling.png").symlink_to(tmp_path / "gone.png")
    (root / "in.png").symlink_to(root / "x.png")
    (root / "outdir").symlink_to(tmp_path)
    os.mkfifo(root / "fifo.png")
    open(os.fsencode(root) + b"/caf\xe9.png", "wb").close()  # Latin-1 name
    paths, skipped = images.find_files(root)
    assert paths == ["a/b/z.txt", "a/y.jpg", "in.png", "x.png"]
    assert {(s.path, s.reason) for s in skipped} == {
        ("a/out.png", "link out of the folder"),
        ("a/dangling.png", "link out of the folder"),
        ("outdir", "link out of the folder"),
        ("fifo.png", "not a regular file"),
        (repr("caf\udce9.png"), "name is not UTF-8"),
    }
    with pytest.raises(NotADirectoryError):
        images.find_files(root / "x.png")
    with pytest.raises(FileNotFoundError, match="image folder not found"):
        images.find_files(tmp_path / "missing")


def test_resolve_refuses_every_way_out(tmp_path):
    root = tmp_path / "photos"
    root.mkdir()
    (root / "x.png").write_bytes(b"data")
    (tmp_path / "secret.png").write_bytes(b"secret")
    (root / "link.png").symlink_to(tmp_path / "secret.png")
    assert images.resolve(root, "x.png") == str((root / "x.png").resolve())
    for bad in ("../secret.png", "/etc/passwd", "a/../../secret.png", "link.png", ""):
        with pytest.raises(PermissionError):
            images.resolve(root, bad)
    with pytest.raises(FileNotFoundError):
        images.resolve(root, "gone.png")


def test_image_batches_stream_and_report_bad_files(tmp_path, picture):
    paths = images.write_image_folder(
        np.stack([picture] * 5), [0, 1, 0, 1, 0], tmp_path
    )
    (tmp_path / "bad.png").write_bytes(b"\x89PNG broken")
    (tmp_path / "note.txt").write_text("hello")
    order = [*paths[:2], "bad.png", *paths[2:], "note.txt", "missing.png"]
    batches = list(images.image_batches(tmp_path, order, (16, 16, 3), batch_size=3))
    assert [len(b.paths) + len(b.skipped) for b in batches] == [3, 3, 2]
    assert [p for b in batches for p in b.paths] == paths
    assert [s.path for b in batches for s in b.skipped] == [
        "bad.png",
        "note.txt",
        "missing.png",
    ]
    pixels = np.concatenate([b.pixels for b in batches])
    assert pixels.shape == (5, 16, 16, 3)
    fingerprints = np.concatenate([b.fingerprints for b in batches])
    assert fingerprints.dtype == np.uint64
    assert fingerprints.tolist() == [images.fingerprint(p) for p in pixels]


def test_write_image_folder_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="uint8"):
        images.write_image_folder(np.zeros((2, 4, 4), np.float32), [0, 1], tmp_path)
    with pytest.raises(ValueError, match="one entry per image"):
        images.write_image_folder(np.zeros((2, 4, 4), np.uint8), [0], tmp_path)


def test_read_image_folder_labels_by_subfolder_and_converts_modes(tmp_path):
    rng = np.random.default_rng(1)
    (tmp_path / "grey").mkdir()
    (tmp_path / "colour" / "deeper").mkdir(parents=True)
    grey = rng.integers(0, 256, (20, 20), dtype=np.uint8)
    Image.fromarray(grey).save(tmp_path / "grey" / "g.png")
    Image.fromarray(grey.astype(np.uint16) * 257).save(tmp_path / "grey" / "g16.png")
    rgba = rng.integers(0, 256, (12, 30, 4), dtype=np.uint8)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "colour" / "deeper" / "a.png")
    Image.fromarray(rgba[..., :3]).save(tmp_path / "colour" / "b.jpg")
    (tmp_path / "colour" / "bad.png").write_bytes(b"nope")
    (tmp_path / "top.png").write_bytes((tmp_path / "colour" / "b.jpg").read_bytes())
    folder = images.read_image_folder(tmp_path, (16, 16, 3))
    assert folder.class_names == ["colour", "grey"]
    assert folder.paths == ["colour/b.jpg", "colour/deeper/a.png", "grey/g.png",
                            "grey/g16.png"]  # fmt: skip
    assert folder.labels.tolist() == [0, 0, 1, 1]
    assert folder.images.shape == (4, 16, 16, 3) and folder.images.dtype == np.uint8
    # 8-bit and 16-bit versions of one grey picture give the same pixels.
    np.testing.assert_array_equal(folder.images[2], folder.images[3])
    assert {(s.path, s.reason.split(" (")[0]) for s in folder.skipped} == {
        ("top.png", "not in a class folder"),
        ("colour/bad.png", "not an image"),
    }


@pytest.mark.parametrize(
    "layout, message",
    [
        ({}, "at least 2, received 0"),
        ({"only/a.png": True}, r"at least 2, received 1 \(\['only'\]\)"),
        (
            {"a/x.png": True, "b/broken.png": False},
            r"without a readable picture: \['b'\]",
        ),
    ],
)
def test_read_image_folder_refuses_what_cannot_train(
    tmp_path, picture, layout, message
):
    data = _encoded(Image.fromarray(picture), "PNG")
    for path, good in layout.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data if good else data[:20])
    with pytest.raises(ValueError, match=message):
        images.read_image_folder(tmp_path, (8, 8, 3))
