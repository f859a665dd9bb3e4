"""Tests for subic_keras.data.images: finding, decoding and writing picture files."""

import io
import os
import threading
import time

import numpy as np
import pytest
from PIL import Image

from subic_keras.data import images


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


def _read_folder(root, shape):
    """A labelled folder decoded as training reads it: paths, classes,
    pixels, labels and the files skipped on the way."""
    paths, class_names, skipped = images.labelled_files(root)
    kept, batches = [], []
    for batch in images.image_batches(root, paths, shape, 256):
        kept += batch.paths
        batches.append(batch.pixels)
        skipped += batch.skipped
    labels = images.class_ids(kept, class_names)
    images.check_classes(labels, class_names, root)
    return kept, class_names, np.concatenate(batches), labels, skipped


def test_a_labelled_folder_is_read_by_subfolder_and_converts_modes(tmp_path):
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
    paths, class_names, pixels, labels, skipped = _read_folder(tmp_path, (16, 16, 3))
    assert class_names == ["colour", "grey"]
    assert paths == ["colour/b.jpg", "colour/deeper/a.png", "grey/g.png",
                     "grey/g16.png"]  # fmt: skip
    assert labels.tolist() == [0, 0, 1, 1]
    assert pixels.shape == (4, 16, 16, 3) and pixels.dtype == np.uint8
    # 8-bit and 16-bit versions of one grey picture give the same pixels.
    np.testing.assert_array_equal(pixels[2], pixels[3])
    assert {(s.path, s.reason.split(" (")[0]) for s in skipped} == {
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
def test_a_labelled_folder_that_cannot_train_is_refused(
    tmp_path, picture, layout, message
):
    data = _encoded(Image.fromarray(picture), "PNG")
    for path, good in layout.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data if good else data[:20])
    with pytest.raises(ValueError, match=message):
        _read_folder(tmp_path, (8, 8, 3))


@pytest.mark.parametrize("fmt", ["PNG", "GIF", "BMP", "WEBP", "JPEG"])
def test_the_pixel_limit_is_checked_from_the_header_for_every_format(fmt):
    buffer = io.BytesIO()
    Image.new("RGB", (300, 200)).save(buffer, fmt)
    data = buffer.getvalue()
    assert images.decode_image(data, (8, 8, 3), max_pixels=60_000).shape == (8, 8, 3)
    with pytest.raises(images.ImageTooLargeError, match="300x200 = 60,000 pixels"):
        images.decode_image(data, (8, 8, 3), max_pixels=59_999)


def test_max_pixels_means_what_it_says_before_anything_is_decoded():
    from benchmarks.bombs import png_bomb

    # 225 Mpx: more than MAX_PIXELS (179 Mpx), less than twice Pillow's limit.
    data = png_bomb(15_000, 15_000)
    start = time.perf_counter()
    with pytest.raises(images.ImageTooLargeError, match="225,000,000 pixels"):
        images.decode_image(data, (32, 32, 3))
    assert time.perf_counter() - start < 1


def test_other_formats_are_refused_before_a_parser_runs():
    buffer = io.BytesIO()
    Image.new("RGB", (10, 10)).save(buffer, "TIFF")
    with pytest.raises(images.ImageDecodeError, match="PNG, JPEG, GIF, BMP or WebP"):
        images.decode_image(buffer.getvalue(), (8, 8, 3))


@pytest.mark.parametrize("mode", ["L", "1", "I;16", "I", "F", "LA", "RGBA", "P"])
def test_memory_lean_conversions_give_pillows_pixels(mode):
    """Grey pictures resized before they become RGB, and 16-bit, float and
    transparent ones converted a strip at a time, give the pixels of the
    whole-picture conversion then the resize."""
    rng = np.random.default_rng(0)
    size = (700, 600)  # more rows than one strip
    if mode in ("I;16", "I"):
        values = rng.integers(0, 65536, size[::-1]).astype(np.uint16)
        image = Image.fromarray(values).convert(mode) if mode == "I" else None
        image = image or Image.fromarray(values)
        whole = Image.fromarray((np.asarray(image, np.int64) >> 8).astype(np.uint8))
    elif mode == "F":
        values = rng.random(size[::-1]).astype(np.float32) * 300 - 20
        image = Image.fromarray(values, "F")
        whole = Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8))
    else:
        bands = {"L": 1, "1": 1, "LA": 2, "RGBA": 4, "P": 1}[mode]
        pixels = rng.integers(0, 256, (*size[::-1], bands), dtype=np.uint8)
        image = Image.fromarray(pixels.squeeze(-1) if bands == 1 else pixels)
        image = image.convert(mode)
        whole = image
        if mode in ("LA", "RGBA"):
            white = Image.new("RGBA", size, (255, 255, 255, 255))
            whole = Image.alpha_composite(white, image.convert("RGBA"))
    buffer = io.BytesIO()
    image.save(buffer, "TIFF" if mode in ("I", "F") else "PNG")
    reference = whole.convert("RGB").resize((40, 30), Image.Resampling.BILINEAR)
    if mode in ("I", "F"):  # not a format we read: the conversion alone
        decoded = images._to_mode(Image.open(buffer), 3)
        decoded = decoded.resize((40, 30), Image.Resampling.BILINEAR).convert("RGB")
        np.testing.assert_array_equal(np.asarray(decoded), np.asarray(reference))
        return
    decoded = images.decode_image(buffer.getvalue(), (30, 40, 3))
    np.testing.assert_array_equal(decoded, np.asarray(reference))


def test_a_decode_budget_is_shared_and_refuses_what_cannot_fit():
    budget = images.DecodeBudget(10 << 20, timeout=0.2)
    with pytest.raises(images.ImageTooLargeError, match="more than the 10 MB"):
        with budget.reserve(11 << 20):
            pass
    order, inside = [], threading.Event()
    # A budget that waits long enough for any scheduler, for the order.
    patient = images.DecodeBudget(10 << 20, timeout=30)

    def hold(name, seconds):
        with patient.reserve(6 << 20):
            order.append(f"{name} in")
            inside.set()
            time.sleep(seconds)
            order.append(f"{name} out")

    first = threading.Thread(target=hold, args=("first", 0.1))
    first.start()
    assert inside.wait(timeout=30)
    hold("second", 0)  # waits for the first: 6 + 6 MB do not fit in 10
    first.join()
    assert order == ["first in", "first out", "second in", "second out"]
    with budget.reserve(6 << 20):
        with pytest.raises(TimeoutError, match="busy decoding"):
            with budget.reserve(6 << 20):
                pass
    with pytest.raises(ValueError, match="total_bytes"):
        images.DecodeBudget(0)


def test_reading_a_fifo_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "q.png")
    start = time.perf_counter()
    with pytest.raises(OSError, match="not a regular file"):
        images.read_image(tmp_path / "q.png", (8, 8, 3))
    assert time.perf_counter() - start < 1


def test_an_empty_class_folder_is_refused_not_dropped(tmp_path):
    images.write_image_folder(np.zeros((4, 8, 8, 3), np.uint8), [0, 1, 0, 1], tmp_path)
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / ".hidden.png").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"class folders without a file: \['2'\]"):
        images.labelled_files(tmp_path)


_BOMBS = """
import resource, sys
from subic_keras.data import images

def peak():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmHWM:"))

root, idle = sys.argv[1], peak()
skipped = [
    entry
    for batch in images.image_batches(root, ["a.png", "b.png", "ok.png"], (32, 32, 3))
    for entry in batch.skipped
]
print(len(skipped), (peak() - idle) // 1024, flush=True)
for entry in skipped:
    print(entry.path, entry.reason)
try:
    images.read_image(f"{root}/a.png", (32, 32, 3))
except images.ImageTooLargeError as error:
    print(error)
"""


def test_files_are_decoded_within_a_memory_budget(tmp_path, picture):
    # Two 13,000 x 13,000 PNGs (a few hundred KB each, 1.35 GB each to
    # decode): refused from their headers, each naming its file, while the
    # process stays within 300 MB of where it was; a small picture decodes.
    import subprocess
    import sys

    from benchmarks.bombs import RGB, png_bomb

    bomb = png_bomb(13_000, 13_000, colour=RGB)
    for name in ("a.png", "b.png"):
        (tmp_path / name).write_bytes(bomb)
    Image.fromarray(picture).save(tmp_path / "ok.png")
    done = subprocess.run(
        [sys.executable, "-c", _BOMBS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    count, peak_mb = map(int, lines[0].split())
    assert count == 2 and peak_mb < 300, lines
    for line, name in zip(lines[1:3], ("a.png", "b.png")):
        assert line.startswith(f"{name} image too large: decoding it takes 1353 MB")
        assert "more than the 512 MB a file is decoded with" in line
        assert "(set SUBIC_DECODE_MB to raise it)" in line
    assert lines[3].endswith(f"to raise it) ({tmp_path}/a.png)")


def test_a_4096_pixel_webp_wallpaper_decodes_within_the_default_budget(tmp_path):
    """GNOME's 4096 x 4096 WebP wallpapers take 269 MB to decode: within a
    file's default budget (512 MB), which `SUBIC_DECODE_MB` names."""
    ramp = np.linspace(0, 255, 4096).astype(np.uint8)
    Image.fromarray(np.stack([np.tile(ramp, (4096, 1))] * 3, -1)).save(
        tmp_path / "wallpaper.webp", quality=50
    )
    pixels = images.read_image(tmp_path / "wallpaper.webp", (32, 32, 3))
    assert pixels.shape == (32, 32, 3) and pixels[0, 0, 0] < pixels[0, -1, 0]
    assert images.FILE_DECODE_BYTES == 512_000_000
    assert "SUBIC_DECODE_MB" in images.FILE_DECODE_BUDGET.owner


def test_the_decode_budget_is_set_by_its_variable_and_checked(tmp_path):
    import subprocess
    import sys

    show = "from subic_keras import images; print(images.FILE_DECODE_BYTES)"
    for value, expected in (("1000", "1000000000"), ("abc", "SUBIC_DECODE_MB must")):
        done = subprocess.run(
            [sys.executable, "-c", show], capture_output=True, text=True,
            env={**os.environ, "SUBIC_DECODE_MB": value}, timeout=60,
        )  # fmt: skip
        assert expected in done.stdout + done.stderr, done.stderr
