"""Image files: finding them in a folder and decoding them the way a model expects.

One decoder serves every path by which a picture reaches a model: the
folders that `subic index build` indexes, the query files of `subic search`
and the uploads of `subic serve`. The same file therefore always gives the
same pixels, so an indexed picture used as a query finds its own code.

Decoding (Pillow): the EXIF orientation is applied; transparent pixels are
composited over white; 16-bit images keep their 8 most significant bits;
the picture is converted to RGB or grey (the model's channels) and resized
to the model's `H×W` with Pillow's antialiased bilinear filter, ignoring the
aspect ratio (as `keras.utils.image_dataset_from_directory` does by
default). Large JPEGs are decoded at a reduced scale first (`draft`), which
is exact up to the final resize and much faster for camera pictures.

NumPy and Pillow only: nothing here loads TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from subic_keras.data.paths import (
    SkippedFile,
    find_files,
    open_in_folder,
    open_regular,
)

_ORIENTATION = 0x0112  # the EXIF tag

# The formats decoded, by file name (case-insensitive), and by Pillow's name:
# a file is recognised by its content, and any other format (TIFF, PSD,
# ICO, ...) is refused before a parser of it runs.
IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".webp")
FORMAT_NAMES = "PNG, JPEG, GIF, BMP or WebP"
_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP")
# The most pixels a picture may claim: one that claims more is refused from
# its header, before it is decoded (Pillow's own guard, stated here).
MAX_PIXELS = 178_956_970
# Rows converted at a time on the way to 8 bits, so that a large picture
# needs one extra copy of a strip, not of the whole picture.
_STRIP_ROWS = 256


class ImageDecodeError(ValueError):
    """A file or upload that is not an image this package can decode."""


class ImageTooLargeError(ImageDecodeError):
    """A picture that claims more pixels, or memory, than it may take."""


def _pillow():
    from PIL import Image, ImageOps

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    # Pillow warns between its limit and twice it; `_decode` refuses all of
    # that range from the header itself, so the warning would only repeat it.
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    return Image, ImageOps


def decoding_memory(image) -> int:
    """The memory, in bytes, that decoding an opened (not yet loaded) Pillow
    image takes at its peak here: the decoded picture and one converted copy
    (`_to_mode` works in strips), and for a WebP the decoder's own buffer."""
    width, height = image.size
    stored = 1 if image.mode in ("1", "L", "P") else 2 if "I;16" in image.mode else 4
    copy = 8 if image.mode in ("RGBA", "LA", "PA", "La", "RGBa", "P") else 4
    decoder = 8 if image.format == "WEBP" else 0
    return width * height * (stored + copy + decoder) + (1 << 20)


class DecodeBudget:
    """Memory that concurrent decodes share: a counting semaphore on bytes.

    `subic serve` decodes uploads in parallel threads; each reserves what
    `decoding_memory` says it needs before it starts, so that several large
    pictures at once wait for each other instead of adding up.

    Args:
        total_bytes: the memory all decodes together may take.
        timeout: seconds a decode waits for room before `TimeoutError`.
        owner: who decodes with it, ending the message that refuses a
            picture larger than the whole budget.
    """

    def __init__(
        self,
        total_bytes: int,
        timeout: float = 30.0,
        owner: str = "this server decodes with",
    ):
        if not total_bytes >= 1 << 20:
            raise ValueError(f"total_bytes must be >= 1 MiB, received {total_bytes}")
        self.total = int(total_bytes)
        self.timeout = float(timeout)
        self.owner = owner
        self._free = self.total
        self._room = threading.Condition()

    @contextlib.contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        """Holds `nbytes` of the budget while the block runs.

        Raises:
            ImageTooLargeError: `nbytes` is more than the whole budget.
            TimeoutError: no room came free within `timeout` seconds.
        """
        if nbytes > self.total:
            raise ImageTooLargeError(
                f"image too large: decoding it takes {nbytes / 1e6:.0f} MB, more "
                f"than the {self.total / 1e6:.0f} MB {self.owner}"
            )
        with self._room:
            if not self._room.wait_for(lambda: self._free >= nbytes, self.timeout):
                raise TimeoutError(
                    "busy decoding other large pictures; try again in a moment"
                )
            self._free -= nbytes
        try:
            yield
        finally:
            with self._room:
                self._free += nbytes
                self._room.notify_all()


# Memory that the files one process decodes at once may take together
# (`index build`/`add`, `train --images`, query files): the server's rule
# (`DecodeBudget`, from the header) for files. 512 MB by default: a
# 4096 x 4096 WebP wallpaper (269 MB) or a 60-megapixel RGB PNG fits, a
# 13,000 x 13,000 one does not; `SUBIC_DECODE_MB` sets another.
DECODE_MB_VARIABLE = "SUBIC_DECODE_MB"


def _file_decode_bytes() -> int:
    text = os.environ.get(DECODE_MB_VARIABLE, "").strip()
    if not text:
        return 512_000_000
    if not text.isdigit() or int(text) < 1:
        raise ValueError(
            f"{DECODE_MB_VARIABLE} must be a whole number of megabytes >= 1, "
            f"received {text[:40]!r}"
        )
    return int(text) * 1_000_000


FILE_DECODE_BYTES = _file_decode_bytes()
FILE_DECODE_BUDGET = DecodeBudget(
    FILE_DECODE_BYTES,
    timeout=600.0,
    owner=f"a file is decoded with (set {DECODE_MB_VARIABLE} to raise it)",
)


def _eight_bits(image):
    """A 16-bit, 32-bit integer or float grey image as 8-bit grey ("L"),
    converted a strip of rows at a time: 16-bit keeps its 8 most significant
    bits (Pillow's convert() would clip at 255), 32-bit integers shift by 8
    when they exceed 255, floats are rounded and clipped."""
    Image, _ = _pillow()
    width, height = image.size
    wide = image.mode.startswith("I;16") or (
        image.mode == "I" and image.getextrema()[1] > 255
    )
    shift = 8 if wide else 0
    out = np.empty((height, width), np.uint8)
    for top in range(0, height, _STRIP_ROWS):
        strip = image.crop((0, top, width, min(top + _STRIP_ROWS, height)))
        if image.mode == "F":
            values = np.rint(np.nan_to_num(np.asarray(strip, np.float64)))
        else:
            values = np.asarray(strip, np.int64) >> shift
        out[top : top + _STRIP_ROWS] = np.clip(values, 0, 255)
    return Image.fromarray(out)


def _over_white(image, mode: str):
    """A transparent image composited over white, as `mode` ("RGB" or "L"),
    a strip of rows at a time."""
    Image, _ = _pillow()
    width, height = image.size
    image = image.convert("RGBA")
    out = Image.new(mode, image.size)
    background = Image.new("RGBA", (width, _STRIP_ROWS), (255, 255, 255, 255))
    for top in range(0, height, _STRIP_ROWS):
        strip = image.crop((0, top, width, min(top + _STRIP_ROWS, height)))
        under = (
            background
            if strip.size == background.size
            else background.crop((0, 0, *strip.size))
        )
        out.paste(Image.alpha_composite(under, strip).convert(mode), (0, top))
    return out


def _to_mode(image, channels: int):
    """`image` as 8-bit RGB (`channels == 3`) or grey: grey pictures stay
    one channel ("L") until after the resize, which gives the same pixels on
    each of the three channels as resizing them all (per-channel filter)."""
    if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        image = _eight_bits(image)
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        return _over_white(image, "RGB" if channels == 3 else "L")
    if image.mode == "1":
        return image.convert("L")
    if image.mode == "L" or image.mode == ("RGB" if channels == 3 else "L"):
        return image
    return image.convert("RGB" if channels == 3 else "L")


def decode_image(
    data: bytes,
    shape: Sequence[int],
    *,
    max_pixels: int = MAX_PIXELS,
    budget: DecodeBudget | None = None,
) -> np.ndarray:
    """Decodes encoded image bytes to uint8 pixels of `shape`.

    Example:

    >>> from PIL import Image
    >>> buffer = io.BytesIO()
    >>> Image.new("RGBA", (640, 480), (255, 0, 0, 128)).save(buffer, "PNG")
    >>> pixels = decode_image(buffer.getvalue(), (32, 32, 3))
    >>> pixels.shape, pixels.dtype, pixels[0, 0].tolist()  # red over white
    ((32, 32, 3), dtype('uint8'), [255, 127, 127])

    Args:
        data: the bytes of a PNG, JPEG, GIF (first frame), BMP or WebP file.
        shape: the model's input shape `(H, W, C)` with `C` 1 or 3, or
            `(H, W)` for grey images.
        max_pixels: a picture whose header claims more pixels is refused
            before it is decoded.
        budget: memory shared with concurrent decodes (`DecodeBudget`);
            `None`: no limit beyond `max_pixels`.

    Returns:
        uint8 pixels `(H, W, C)` (or `(H, W)` for a 2-d `shape`).

    Raises:
        ImageTooLargeError: more than `max_pixels`, or than `budget` holds.
        ImageDecodeError: `data` is not a decodable image or is truncated.
        TimeoutError: `budget` had no room in time.
        ValueError: for a `shape` that is not `(H, W, C)` with `C` 1 or 3.
    """
    return _decode(io.BytesIO(data), shape, max_pixels, budget)


def _decode(stream, shape, max_pixels: int, budget: DecodeBudget | None):
    shape = tuple(int(s) for s in shape)
    channels = shape[2] if len(shape) == 3 else 1
    if len(shape) not in (2, 3) or channels not in (1, 3) or min(shape[:2]) < 1:
        raise ValueError(
            f"shape must be (H, W) or (H, W, C) with C 1 or 3, received {shape}"
        )
    Image, ImageOps = _pillow()
    height, width = shape[:2]
    try:
        with Image.open(stream, formats=_FORMATS) as image:
            columns, rows = image.size
            if columns * rows > max_pixels:
                raise ImageTooLargeError(
                    f"image too large: {columns}x{rows} = {columns * rows:,} "
                    f"pixels, more than {max_pixels:,}"
                )
            if image.format in ("JPEG", "MPO"):
                # Decode at the smallest scale (1/2, 1/4, 1/8) still at least
                # twice the target size, so the resize below still antialiases.
                image.draft(image.mode, (2 * width, 2 * height))
            reserved = (
                budget.reserve(decoding_memory(image))
                if budget is not None
                else contextlib.nullcontext()
            )
            with reserved:
                image.load()
                if image.getexif().get(_ORIENTATION, 1) != 1:
                    image = ImageOps.exif_transpose(image)
                image = _to_mode(image, channels)
                if image.size != (width, height):
                    image = image.resize((width, height), Image.Resampling.BILINEAR)
                if channels == 3 and image.mode == "L":
                    image = image.convert("RGB")
                pixels = np.asarray(image, dtype=np.uint8)
    except Image.DecompressionBombError as error:
        raise ImageTooLargeError(f"image too large: {error}") from None
    except (OSError, SyntaxError, ValueError, EOFError, TypeError) as error:
        if isinstance(error, ImageDecodeError):
            raise
        # Pillow raises UnidentifiedImageError (an OSError) for what is not
        # an image, OSError for truncated data, and the others from plugins.
        reason = str(error) or type(error).__name__
        if "cannot identify image file" in reason:
            reason = f"not an image ({FORMAT_NAMES})"
        raise ImageDecodeError(reason) from None
    return pixels[..., None] if len(shape) == 3 and pixels.ndim == 2 else pixels


def read_image(
    path: str | os.PathLike,
    shape: Sequence[int],
    *,
    fd: int | None = None,
    budget: DecodeBudget | None = FILE_DECODE_BUDGET,
) -> np.ndarray:
    """Reads and decodes one image file (`decode_image`), streamed from the
    file: only its header is read before the pixel limit and the memory
    its decoding takes (`budget`) are checked.

    Args:
        path: the file (opened without blocking: a FIFO is refused).
        shape: as `decode_image`'s.
        fd: a descriptor already open on the file (`paths.open_in_folder`),
            closed here; `path` then only names it in messages.
        budget: memory shared with the process's other decodes; by
            default `FILE_DECODE_BUDGET` (512 MB, `SUBIC_DECODE_MB`), `None`
            for no limit beyond `MAX_PIXELS`.

    Raises:
        ImageTooLargeError: naming the path, for a picture whose decoding
            takes more than the whole `budget`.
        ImageDecodeError: naming the path, for a file that is not a
            decodable image.
        OSError: for a file that cannot be read, or is not a regular file.
    """
    path = os.fspath(path)
    if fd is None:
        fd = open_regular(path)
    with open(fd, "rb") as handle:
        try:
            return _decode(handle, shape, MAX_PIXELS, budget)
        except ImageDecodeError as error:  # the same kind, naming the path
            raise type(error)(f"{error} ({path})") from None


def check_picture(path: str | os.PathLike) -> str:
    """The format of a picture file, read from its header alone (nothing is
    decoded): what lets a command refuse a file that is no picture before
    it loads a model.

    Returns:
        The format's name (`"PNG"`, `"JPEG"`, ...), one of `FORMAT_NAMES`.

    Raises:
        ImageDecodeError: naming the path, for a file of no such format.
        OSError: for a file that cannot be read, or is not a regular file.
    """
    path = os.fspath(path)
    Image, _ = _pillow()
    with open(open_regular(path), "rb") as handle:
        try:
            with Image.open(handle, formats=_FORMATS) as image:
                return str(image.format)
        except Image.DecompressionBombError as error:
            raise ImageTooLargeError(f"image too large: {error} ({path})") from None
        except (OSError, SyntaxError, ValueError, EOFError):
            raise ImageDecodeError(f"not a picture ({FORMAT_NAMES}) ({path})") from None


def fingerprint(pixels: np.ndarray) -> int:
    """A 64-bit digest of decoded pixels (BLAKE2b): equal for the same picture.

    The index stores it per item, so that an exact copy of a query (the same
    pixels at the model's input size) is recognised among equal scores.
    """
    pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    digest = hashlib.blake2b(repr(pixels.shape).encode(), digest_size=8)
    digest.update(pixels.tobytes())
    return int.from_bytes(digest.digest(), "little")


@dataclasses.dataclass
class ImageBatch:
    """Decoded pictures of one batch, and the files of it that were skipped."""

    paths: list[str]
    pixels: np.ndarray  # uint8 (n, H, W, C)
    fingerprints: np.ndarray  # uint64 (n,)
    skipped: list[SkippedFile]
    # (device, inode, size, modification time in ns) of each decoded file,
    # taken from the very descriptor it was decoded from.
    identities: list[tuple[int, int, int, int]] = dataclasses.field(
        default_factory=list
    )


def file_identity(status: os.stat_result) -> tuple[int, int, int, int]:
    """What tells a file's contents apart from an earlier version's without
    reading it: device, inode, size and modification time (ns)."""
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


def image_batches(
    root: str | os.PathLike,
    paths: Sequence[str],
    shape: Sequence[int],
    batch_size: int = 256,
    workers: int | None = None,
) -> Iterator[ImageBatch]:
    """Decodes `paths` (relative to `root`) in batches, in order.

    Memory holds one batch at a time (and the next, being decoded), however
    many files there are. A file that cannot be read or decoded is reported
    in its batch's `skipped`, never raised.

    Args:
        root: the folder.
        paths: relative paths, as `find_files` returns them.
        shape: the model's input shape `(H, W, C)`.
        batch_size: pictures per batch.
        workers: decoding threads (Pillow releases the GIL while it
            decodes); default: the machine's cores.
    """
    shape = tuple(int(s) for s in shape)
    zero = np.zeros((0, *shape), np.uint8)
    real_root = os.path.realpath(root)

    def load(relative: str):
        try:
            fd = open_in_folder(real_root, relative)
            try:
                identity = file_identity(os.fstat(fd))
            except OSError:
                os.close(fd)
                raise
            return read_image(relative, shape, fd=fd), identity
        except ImageDecodeError as error:
            return SkippedFile(relative, str(error).rsplit(" (", 1)[0])
        except OSError as error:
            return SkippedFile(relative, error.strerror or str(error))

    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        starts = range(0, len(paths), batch_size)
        pending = None
        for start in [*starts, None]:
            upcoming = None
            if start is not None:
                upcoming = (
                    paths[start : start + batch_size],
                    pool.map(load, paths[start : start + batch_size]),
                )
            if pending is not None:
                names, results = pending
                good, pixels, skipped, identities = [], [], [], []
                for name, result in zip(names, results):
                    if isinstance(result, SkippedFile):
                        skipped.append(result)
                    else:
                        good.append(name)
                        pixels.append(result[0])
                        identities.append(result[1])
                stacked = np.stack(pixels) if pixels else zero
                yield ImageBatch(
                    good,
                    stacked,
                    np.array([fingerprint(p) for p in pixels], dtype=np.uint64),
                    skipped,
                    identities,
                )
            pending = upcoming


def write_image_folder(
    images: np.ndarray,
    labels: Sequence[int],
    root: str | os.PathLike,
    class_names: Sequence[str] | None = None,
    extension: str = ".png",
) -> list[str]:
    """Writes uint8 images as files in one subfolder per class.

    The layout `keras.utils.image_dataset_from_directory` and `subic index
    build` read: `root/<class name>/<class name>_<position>.png`. Useful to
    try the folder commands on a dataset the package loads.

    Example:

    >>> import tempfile
    >>> pictures = np.zeros((3, 8, 8, 3), np.uint8)
    >>> write_image_folder(pictures, [0, 1, 1], tempfile.mkdtemp(), ["cat", "dog"])
    ['cat/cat_00000.png', 'dog/dog_00001.png', 'dog/dog_00002.png']

    Args:
        images: uint8 `(n, H, W)` or `(n, H, W, C)` with `C` 1 or 3.
        labels: `n` class ids.
        root: the folder to write into (created if missing).
        class_names: a name per class id (default: the ids as text).
        extension: the file format, by extension (`.png`, `.jpg`, ...).

    Returns:
        The relative paths written, in the order of `images`.
    """
    Image, _ = _pillow()
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise ValueError(
            f"images must be uint8 (n, H, W[, C]), received {images.dtype} "
            f"{images.shape}"
        )
    labels = [int(label) for label in labels]
    if len(labels) != len(images):
        raise ValueError(
            f"labels must have one entry per image ({len(images)}), received "
            f"{len(labels)}"
        )
    digits = max(5, len(str(len(images) - 1)))
    written = []
    for position, (pixels, label) in enumerate(zip(images, labels)):
        name = class_names[label] if class_names is not None else str(label)
        os.makedirs(os.path.join(root, name), exist_ok=True)
        relative = f"{name}/{name}_{position:0{digits}d}{extension}"
        if pixels.ndim == 3 and pixels.shape[-1] == 1:
            pixels = pixels[..., 0]
        Image.fromarray(pixels).save(os.path.join(root, relative))
        written.append(relative)
    return written


def labelled_files(
    root: str | os.PathLike,
) -> tuple[list[str], list[str], list[SkippedFile]]:
    """The files of a class-per-subfolder tree, without decoding them.

    Every folder directly under `root` is a class, an empty one (or one of
    hidden files only) too, so that it is refused rather than silently
    dropped from the classes.

    Returns:
        `(paths, class_names, skipped)`: relative paths in sorted order,
        the sorted class folder names, and the files left out (directly
        under `root`, or not regular files).

    Raises:
        ValueError: fewer than two class folders, or a class folder that
            holds no file.
    """
    paths, skipped = find_files(root)
    with os.scandir(os.fspath(root)) as listing:
        folders = {
            entry.name
            for entry in listing
            if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False)
        }
    class_names = sorted(folders | {p.split("/", 1)[0] for p in paths if "/" in p})
    skipped += [SkippedFile(p, "not in a class folder") for p in paths if "/" not in p]
    paths = [path for path in paths if "/" in path]
    if len(class_names) < 2:
        raise ValueError(
            "a labelled folder needs one subfolder per class, at least 2, "
            f"received {len(class_names)} ({class_names}) in {os.fspath(root)}"
        )
    check_classes(class_ids(paths, class_names), class_names, root, "file")
    return paths, class_names, skipped


def class_ids(paths: Sequence[str], class_names: Sequence[str]) -> np.ndarray:
    """The class id of each relative path: its first folder's position."""
    index = {name: i for i, name in enumerate(class_names)}
    return np.array([index[p.split("/", 1)[0]] for p in paths], dtype=np.int64)


def check_classes(
    labels: np.ndarray,
    class_names: Sequence[str],
    root: str | os.PathLike,
    what: str = "readable picture",
) -> None:
    """Raises `ValueError` naming the classes without a `what`."""
    empty = [name for i, name in enumerate(class_names) if not np.any(labels == i)]
    if empty:
        raise ValueError(
            f"class folders without a {what}: {empty} (in "
            f"{os.fspath(root)}); remove them or add pictures"
        )
