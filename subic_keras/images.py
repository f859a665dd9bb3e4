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

import dataclasses
import hashlib
import io
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# The formats `read_image` decodes, by file name (case-insensitive). Files
# with other names are still tried: a picture is recognised by its content.
IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".webp")
# Pillow's own guard against decompression bombs, stated here: a file that
# claims more pixels than this is refused before it is decoded.
MAX_PIXELS = 178_956_970


class ImageDecodeError(ValueError):
    """A file or upload that is not an image this package can decode."""


@dataclasses.dataclass(frozen=True)
class SkippedFile:
    """A file of a folder that was not indexed, and why."""

    path: str
    reason: str


def _pillow():
    from PIL import Image, ImageOps

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    return Image, ImageOps


def _to_mode(image, channels: int):
    """`image` as 8-bit RGB (`channels == 3`) or grey (`channels == 1`)."""
    Image, _ = _pillow()
    if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        # 16-bit (or 32-bit integer) grey: Pillow's convert() would clip at
        # 255; keep the 8 most significant bits of 16 instead.
        values = np.asarray(image, dtype=np.int64)
        shift = 8 if image.mode.startswith("I;16") or values.max() > 255 else 0
        image = Image.fromarray(np.clip(values >> shift, 0, 255).astype(np.uint8))
    elif image.mode == "F":
        values = np.nan_to_num(np.asarray(image, dtype=np.float64))
        image = Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8))
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, image)
    return image.convert("RGB" if channels == 3 else "L")


def decode_image(data: bytes, shape: Sequence[int]) -> np.ndarray:
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

    Returns:
        uint8 pixels `(H, W, C)` (or `(H, W)` for a 2-d `shape`).

    Raises:
        ImageDecodeError: `data` is not a decodable image, is truncated, or
            claims more than `MAX_PIXELS` pixels.
        ValueError: for a `shape` that is not `(H, W[, C])` with `C` 1 or 3.
    """
    shape = tuple(int(s) for s in shape)
    channels = shape[2] if len(shape) == 3 else 1
    if len(shape) not in (2, 3) or channels not in (1, 3) or min(shape[:2]) < 1:
        raise ValueError(
            f"shape must be (H, W) or (H, W, C) with C 1 or 3, received {shape}"
        )
    Image, ImageOps = _pillow()
    height, width = shape[:2]
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format == "JPEG":
                # Decode at the smallest scale (1/2, 1/4, 1/8) still at least
                # twice the target size, so the resize below still antialiases.
                image.draft(image.mode, (2 * width, 2 * height))
            image.load()
            image = ImageOps.exif_transpose(image)
            image = _to_mode(image, channels)
            if image.size != (width, height):
                image = image.resize((width, height), Image.Resampling.BILINEAR)
            pixels = np.asarray(image, dtype=np.uint8)
    except Image.DecompressionBombError as error:
        raise ImageDecodeError(f"image too large: {error}") from None
    except (OSError, SyntaxError, ValueError, EOFError, TypeError) as error:
        # Pillow raises UnidentifiedImageError (an OSError) for what is not
        # an image, OSError for truncated data, and the others from plugins.
        reason = str(error) or type(error).__name__
        if "cannot identify image file" in reason:
            reason = "not an image (PNG, JPEG, GIF, BMP or WebP)"
        raise ImageDecodeError(reason) from None
    return pixels[..., None] if len(shape) == 3 and pixels.ndim == 2 else pixels


def read_image(path: str | os.PathLike, shape: Sequence[int]) -> np.ndarray:
    """Reads and decodes one image file (`decode_image`).

    Raises:
        ImageDecodeError: naming the path, for a file that is not a
            decodable image.
        OSError: for a file that cannot be read.
    """
    path = os.fspath(path)
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        return decode_image(data, shape)
    except ImageDecodeError as error:
        raise ImageDecodeError(f"{error} ({path})") from None


def fingerprint(pixels: np.ndarray) -> int:
    """A 64-bit digest of decoded pixels (BLAKE2b): equal for the same picture.

    The index stores it per item, so that an exact copy of a query (the same
    pixels at the model's input size) is recognised among equal scores.
    """
    pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    digest = hashlib.blake2b(repr(pixels.shape).encode(), digest_size=8)
    digest.update(pixels.tobytes())
    return int.from_bytes(digest.digest(), "little")


def check_folder(root: str | os.PathLike) -> str:
    """`root` if it is a folder; otherwise the error that says what it is."""
    root = os.fspath(root)
    if not os.path.exists(root):
        raise FileNotFoundError(2, "image folder not found", root)
    if not os.path.isdir(root):
        raise NotADirectoryError(20, "not a folder of images", root)
    return root


def find_files(root: str | os.PathLike) -> tuple[list[str], list[SkippedFile]]:
    """Every regular file under `root`, recursively, as sorted relative paths.

    Names starting with a dot (hidden files and folders) are passed over, as
    `ls` does. Symbolic links are followed only where they stay inside
    `root`: one that leads out of it, or nowhere, is skipped and reported, so
    that nothing outside the folder is ever indexed (or served).

    Returns:
        `(paths, skipped)`: POSIX-style paths relative to `root`, and the
        links that were not followed.

    Raises:
        NotADirectoryError, FileNotFoundError: `root` is not a folder.
    """
    root = check_folder(root)
    real_root = os.path.realpath(root)
    paths, skipped = [], []
    for directory, folders, files in os.walk(root, followlinks=True):
        relative_dir = os.path.relpath(directory, root)
        kept = []
        for name in sorted(folders):
            if name.startswith("."):
                continue
            full = os.path.join(directory, name)
            if os.path.islink(full) and not _inside(full, real_root):
                skipped.append(
                    SkippedFile(_relative(relative_dir, name), "link out of the folder")
                )
                continue
            kept.append(name)
        folders[:] = kept
        for name in sorted(files):
            if name.startswith("."):
                continue
            full = os.path.join(directory, name)
            relative = _relative(relative_dir, name)
            if os.path.islink(full) and not _inside(full, real_root):
                skipped.append(SkippedFile(relative, "link out of the folder"))
            elif not _utf8(relative):
                skipped.append(SkippedFile(repr(relative), "name is not UTF-8"))
            elif not os.path.isfile(full):
                skipped.append(SkippedFile(relative, "not a regular file"))
            else:
                paths.append(relative)
    return sorted(paths), skipped


def _utf8(name: str) -> bool:
    # Python keeps undecodable bytes of a file name as surrogates.
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def _relative(directory: str, name: str) -> str:
    path = name if directory == os.curdir else os.path.join(directory, name)
    return path.replace(os.sep, "/")


def _inside(path: str, real_root: str) -> bool:
    real = os.path.realpath(path)
    return os.path.exists(real) and os.path.commonpath([real, real_root]) == real_root


def resolve(root: str | os.PathLike, relative: str) -> str:
    """The real path of `relative` under `root`, refused if it leads outside.

    Raises:
        PermissionError: for an absolute path, `..` components or a link
            that leads out of `root`.
        FileNotFoundError: the file does not exist (any more).
    """
    real_root = os.path.realpath(root)
    parts = relative.split("/")
    if os.path.isabs(relative) or any(part in ("", os.pardir) for part in parts):
        raise PermissionError(13, "path outside the image folder", relative)
    full = os.path.join(real_root, *parts)
    real = os.path.realpath(full)
    if os.path.commonpath([real, real_root]) != real_root:
        raise PermissionError(13, "path outside the image folder", relative)
    if not os.path.isfile(real):
        raise FileNotFoundError(2, "image file not found", relative)
    return real


@dataclasses.dataclass
class ImageBatch:
    """Decoded pictures of one batch, and the files of it that were skipped."""

    paths: list[str]
    pixels: np.ndarray  # uint8 (n, H, W, C)
    fingerprints: np.ndarray  # uint64 (n,)
    skipped: list[SkippedFile]


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

    def load(relative: str):
        try:
            return read_image(resolve(root, relative), shape)
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
                good, pixels, skipped = [], [], []
                for name, result in zip(names, results):
                    if isinstance(result, SkippedFile):
                        skipped.append(result)
                    else:
                        good.append(name)
                        pixels.append(result)
                stacked = np.stack(pixels) if pixels else zero
                yield ImageBatch(
                    good,
                    stacked,
                    np.array([fingerprint(p) for p in pixels], dtype=np.uint64),
                    skipped,
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


@dataclasses.dataclass
class ImageFolder:
    """The pictures of a class-per-subfolder tree, decoded to one size."""

    images: np.ndarray  # uint8 (n, H, W, C)
    labels: np.ndarray  # int64 (n,), indices into class_names
    class_names: list[str]
    paths: list[str]  # relative to the folder, in the order of images
    skipped: list[SkippedFile]


def read_image_folder(
    root: str | os.PathLike, shape: Sequence[int], batch_size: int = 256
) -> ImageFolder:
    """Reads a labelled folder: one subfolder per class, pictures inside.

    The layout of `keras.utils.image_dataset_from_directory`: `root/cat/…`,
    `root/dog/…`, classes in the sorted order of their folder names, each
    folder searched recursively. Files directly under `root`, hidden names
    and files that are not pictures are skipped and reported, never raised.

    Example:

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> _ = write_image_folder(np.zeros((4, 8, 8, 3), np.uint8), [0, 1, 1, 0],
    ...                        root, ["cat", "dog"])
    >>> folder = read_image_folder(root, (16, 16, 3))
    >>> folder.images.shape, folder.labels.tolist(), folder.class_names
    ((4, 16, 16, 3), [0, 0, 1, 1], ['cat', 'dog'])

    Args:
        root: the folder.
        shape: the model's input shape `(H, W, C)`.
        batch_size: pictures decoded at a time (in parallel threads).

    Returns:
        An `ImageFolder`.

    Raises:
        ValueError: fewer than two class folders, or a class folder with no
            picture that decodes (the message names them).
        NotADirectoryError, FileNotFoundError: `root` is not a folder.
    """
    paths, class_names, skipped = labelled_files(root)
    kept: list[str] = []
    batches = []
    for batch in image_batches(root, paths, shape, batch_size):
        kept += batch.paths
        batches.append(batch.pixels)
        skipped += batch.skipped
    labels = class_ids(kept, class_names)
    check_classes(labels, class_names, root)
    return ImageFolder(np.concatenate(batches), labels, class_names, kept, skipped)


def labelled_files(
    root: str | os.PathLike,
) -> tuple[list[str], list[str], list[SkippedFile]]:
    """The files of a class-per-subfolder tree, without decoding them.

    Returns:
        `(paths, class_names, skipped)`: relative paths in sorted order,
        the sorted class folder names, and the files left out (directly
        under `root`, or not regular files).

    Raises:
        ValueError: fewer than two class folders.
    """
    paths, skipped = find_files(root)
    class_names = sorted({path.split("/", 1)[0] for path in paths if "/" in path})
    skipped += [SkippedFile(p, "not in a class folder") for p in paths if "/" not in p]
    paths = [path for path in paths if "/" in path]
    if len(class_names) < 2:
        raise ValueError(
            "a labelled folder needs one subfolder per class, at least 2, "
            f"received {len(class_names)} ({class_names}) in {os.fspath(root)}"
        )
    return paths, class_names, skipped


def class_ids(paths: Sequence[str], class_names: Sequence[str]) -> np.ndarray:
    """The class id of each relative path: its first folder's position."""
    index = {name: i for i, name in enumerate(class_names)}
    return np.array([index[p.split("/", 1)[0]] for p in paths], dtype=np.int64)


def check_classes(
    labels: np.ndarray, class_names: Sequence[str], root: str | os.PathLike
) -> None:
    """Raises `ValueError` naming the classes without a readable picture."""
    empty = [name for i, name in enumerate(class_names) if not np.any(labels == i)]
    if empty:
        raise ValueError(
            f"class folders without a readable picture: {empty} (in "
            f"{os.fspath(root)}); remove them or add pictures"
        )
