"""`LiteRTFeatureExtractor`: a frozen LiteRT (TFLite) feature extractor run
outside Keras, its outputs cached on disk and fed to `feature_input`.
"""

from __future__ import annotations

import hashlib
import numbers
import os
import sys

import numpy as np

from subic_keras._io import atomic_path
from subic_keras._validation import check_int
from subic_keras.data.paths import open_file
from subic_keras.models.litert import interpreter_class

# Bumped whenever the extractor's preprocessing changes, so that stale caches
# computed the old way are never returned.
_CACHE_VERSION = 1
_RESIZE_METHOD = "bilinear"


def _quantization(details: dict) -> tuple[float, int]:
    """Per-tensor `(scale, zero_point)`; scale 0 for a float tensor."""
    params = details.get("quantization_parameters", {})
    scales = np.asarray(params.get("scales", []))
    if scales.size > 1:
        raise ValueError(
            f"per-channel quantized tensor {details['name']!r} is not supported"
        )
    scale, zero_point = details["quantization"]
    return float(scale), int(zero_point)


class LiteRTFeatureExtractor:
    """Runs a LiteRT (TFLite) image feature extractor on uint8 images.

    Images are replicated to RGB if grey, resized to the model's input size
    with bilinear interpolation, then normalized as `(pixel - input_mean) /
    input_std` and, for a quantized input, quantized with the input tensor's
    own `(scale, zero_point)`: `q = round(real / scale + zero_point)`. By
    default the normalization is the one the quantization implies for raw
    pixels, `pixel -> q = pixel` for uint8 inputs (`pixel - 128` for int8),
    and `(pixel - 127.5) / 127.5` for float inputs. Quantized outputs are
    dequantized with the output tensor's `(scale, zero_point)`:
    `feature = scale * (q - zero_point)`.

    An interpreter is not thread-safe: use one extractor per thread.

    Example:

    >>> extractor = LiteRTFeatureExtractor(
    ...     "data/mobilenet/mobilenet_v1_1.0_224_quant_embedding_extractor.tflite",
    ...     num_threads=1,
    ... )
    >>> features = extractor.extract(images, cache_dir="cache")  # uint8 RGB
    >>> features.shape, features.dtype
    ((64, 1024), dtype('float32'))

    Args:
        model_path: the `.tflite` file; one rank-4 image input
            `(batch, height, width, 3)`, any batch size.
        num_threads: CPU threads of the interpreter (`None`: its default).
        input_mean: the pixel value mapped to 0 (see above); `None` derives it.
        input_std: the pixel range mapped to 1 (see above); `None` derives it.

    Raises:
        FileNotFoundError: if `model_path` does not exist.
        ValueError: if the file is not a LiteRT image model.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        num_threads: int | None = None,
        *,
        input_mean: float | None = None,
        input_std: float | None = None,
    ):
        self.model_path = os.fspath(model_path)
        if not os.path.isfile(self.model_path):
            raise FileNotFoundError(f"LiteRT model file not found: {self.model_path!r}")
        if num_threads is not None:
            num_threads = check_int("num_threads", num_threads, minimum=1)
        self.num_threads = num_threads
        with open_file(self.model_path) as handle:
            self._model_digest = hashlib.sha256(handle.read()).hexdigest()
        try:
            self._interpreter = interpreter_class()(
                model_path=self.model_path, num_threads=num_threads
            )
            self._interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as error:
            raise ValueError(
                f"could not load LiteRT model {self.model_path!r}: {error}"
            ) from error

        inputs = self._interpreter.get_input_details()
        outputs = self._interpreter.get_output_details()
        shapes = [tuple(int(v) for v in d["shape"]) for d in inputs]
        if len(shapes) != 1 or len(shapes[0]) != 4 or shapes[0][3] != 3:
            raise ValueError(
                f"LiteRT model {self.model_path!r} must have one image input of "
                f"shape (batch, height, width, 3), received {shapes}"
            )
        self._input, self._output = inputs[0], outputs[0]
        self._input_dtype = np.dtype(self._input["dtype"])
        self._input_quantization = _quantization(self._input)
        self._output_quantization = _quantization(self._output)
        self._dynamic_batch = int(self._input["shape_signature"][0]) == -1
        self._batch = int(self._input["shape"][0])
        self._feature_dim = int(np.prod(self._output["shape"][1:]))
        self.input_mean, self.input_std = self._normalization(input_mean, input_std)

    def _normalization(self, mean, std) -> tuple[float, float]:
        """Fills in the defaults of `(input_mean, input_std)`."""
        scale, zero_point = self._input_quantization
        if self._input_dtype.kind in "iu" and scale > 0:
            # Raw pixels fill the integer range: q = pixel + qmin.
            default = (
                float(zero_point - np.iinfo(self._input_dtype).min),
                1.0 / scale,
            )
        elif self._input_dtype.kind == "f":
            default = (127.5, 127.5)
        else:
            raise ValueError(
                f"LiteRT model {self.model_path!r} has an unsupported input type "
                f"{self._input_dtype} (float or quantized integer expected)"
            )
        mean = default[0] if mean is None else mean
        std = default[1] if std is None else std
        for arg, value in (("input_mean", mean), ("input_std", std)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{arg} must be a real number, received {value!r}")
        if not np.isfinite(mean) or not np.isfinite(std) or std <= 0:
            raise ValueError(
                f"input_mean must be finite and input_std > 0, received "
                f"input_mean={mean}, input_std={std}"
            )
        return float(mean), float(std)

    @property
    def feature_dim(self) -> int:
        """The length of a feature vector."""
        return self._feature_dim

    @property
    def input_size(self) -> tuple[int, int]:
        """The model's `(height, width)`; images are resized to it."""
        return int(self._input["shape"][1]), int(self._input["shape"][2])

    def extract(
        self,
        images: np.ndarray,
        batch_size: int = 64,
        cache_dir: str | os.PathLike | None = None,
        progress: bool = True,
        chunk_size: int | None = None,
    ) -> np.ndarray:
        """Features of a set of images.

        Args:
            images: uint8 `(n, height, width, 3)` RGB or `(n, height, width)`
                (or `(n, height, width, 1)`) grey images.
            batch_size: images resized at once (bounds memory; the model still
                runs at its own batch size).
            cache_dir: if given, features are saved to and loaded from a `.npy`
                file there, keyed by the model file, the images and the
                preprocessing.
            progress: show a tqdm progress bar.
            chunk_size: with `cache_dir`, cache every `chunk_size` images as
                their own entry, so that an interrupted extraction of a large
                set resumes from its last finished chunk.

        Returns:
            float32 features `(n, feature_dim)`.

        Raises:
            TypeError: if `images` is not a uint8 array.
            ValueError: for a wrong image rank or channel count.
        """
        images = self._check_images(images)
        batch_size = check_int("batch_size", batch_size, minimum=1)
        if chunk_size is not None:
            chunk_size = check_int("chunk_size", chunk_size, minimum=1)
            if cache_dir is not None and len(images) > chunk_size:
                chunks = range(0, len(images), chunk_size)
                return np.concatenate(
                    [
                        self.extract(
                            images[s : s + chunk_size], batch_size, cache_dir, progress
                        )
                        for s in chunks
                    ]
                )
        cache_path = None
        if cache_dir is not None:
            cache_path = os.path.join(
                os.fspath(cache_dir), f"litert_features_{self._cache_key(images)}.npy"
            )
            cached = self._load_cache(cache_path, len(images))
            if cached is not None:
                return cached

        from tqdm.auto import tqdm

        features = np.empty((len(images), self.feature_dim), np.float32)
        with tqdm(
            total=len(images),
            disable=not progress,
            desc=f"features ({os.path.basename(self.model_path)})",
            unit="image",
            file=sys.stderr,
        ) as bar:
            for start in range(0, len(images), batch_size):
                chunk = self._prepare(images[start : start + batch_size])
                features[start : start + len(chunk)] = self._run(chunk)
                bar.update(len(chunk))
        if cache_path is not None:
            with atomic_path(cache_path, suffix=".npy") as tmp:
                np.save(tmp, features)
        return features

    def _check_images(self, images) -> np.ndarray:
        if not isinstance(images, np.ndarray):
            raise TypeError(
                f"images must be a NumPy array, received {type(images).__name__}"
            )
        if images.dtype != np.uint8:
            raise TypeError(
                "images must be uint8 pixels in 0..255, received dtype "
                f"{images.dtype}; convert with np.clip(x, 0, 255).astype(np.uint8)"
            )
        if images.ndim == 3:
            images = images[..., np.newaxis]
        if images.ndim != 4 or images.shape[-1] not in (1, 3):
            raise ValueError(
                "images must have shape (n, height, width, 3) or (n, height, "
                f"width), received shape {images.shape}"
            )
        if min(images.shape[1:3]) < 1:
            raise ValueError(f"images must be non-empty, received shape {images.shape}")
        return images

    def _cache_key(self, images: np.ndarray) -> str:
        key = hashlib.sha256()
        key.update(self._model_digest.encode())
        key.update(hashlib.sha256(np.ascontiguousarray(images).data).digest())
        key.update(
            repr(
                (
                    _CACHE_VERSION,
                    images.shape,
                    _RESIZE_METHOD,
                    self.input_mean,
                    self.input_std,
                )
            ).encode()
        )
        return key.hexdigest()[:40]

    def _load_cache(self, path: str, n: int) -> np.ndarray | None:
        if not os.path.isfile(path):
            return None
        try:
            with open_file(path) as handle:
                features = np.load(handle, allow_pickle=False)
        except (OSError, ValueError):
            return None
        if features.shape != (n, self.feature_dim) or features.dtype != np.float32:
            return None
        return features

    def _prepare(self, images: np.ndarray) -> np.ndarray:
        """Resizes, replicates grey to RGB and converts to the input's dtype."""
        import tensorflow as tf

        pixels = images
        if images.shape[1:3] != self.input_size:
            pixels = tf.image.resize(
                images, self.input_size, method=_RESIZE_METHOD
            ).numpy()
        # Bilinear resizing acts on channels independently, so grey images are
        # replicated after it, at a third of the cost.
        pixels = np.broadcast_to(pixels, (*pixels.shape[:3], 3))
        scale, zero_point = self._input_quantization
        identity = (
            self._input_dtype == np.uint8
            and pixels.dtype == np.uint8
            and (self.input_mean, self.input_std) == (zero_point, 1.0 / scale)
        )
        if identity:
            return np.ascontiguousarray(pixels)
        # One affine map, `pixels * gain + offset`, computed in place: the
        # normalization, and for an integer input its quantization too,
        # without a new array for each step.
        gain = 1.0 / self.input_std
        offset = -self.input_mean / self.input_std
        if self._input_dtype.kind != "f":
            gain, offset = gain / scale, offset / scale + zero_point
        values = np.array(pixels, dtype=np.float32)  # a copy of its own
        values *= np.float32(gain)
        values += np.float32(offset)
        if self._input_dtype.kind == "f":
            return values.astype(self._input_dtype, copy=False)
        info = np.iinfo(self._input_dtype)
        np.rint(values, out=values)
        np.clip(values, info.min, info.max, out=values)
        return values.astype(self._input_dtype)

    def _run(self, inputs: np.ndarray) -> np.ndarray:
        """Features of preprocessed inputs, at the model's batch size."""
        if self._dynamic_batch:
            if len(inputs) != self._batch:
                self._interpreter.resize_tensor_input(
                    self._input["index"], [len(inputs), *self.input_size, 3]
                )
                self._interpreter.allocate_tensors()
                self._batch = len(inputs)
            return self._invoke(inputs)
        # A fixed batch (often 1) is kept rather than resized: on MobileNet v1
        # with XNNPACK, batches of 8 to 64 measured no faster per image than
        # single images, and not every model accepts another batch size.
        outputs = []
        for start in range(0, len(inputs), self._batch):
            group = inputs[start : start + self._batch]
            missing = self._batch - len(group)
            if missing:
                padding = np.zeros((missing, *group.shape[1:]), group.dtype)
                group = np.concatenate([group, padding])
            outputs.append(self._invoke(group)[: self._batch - missing])
        return np.concatenate(outputs)

    def _invoke(self, inputs: np.ndarray) -> np.ndarray:
        self._interpreter.set_tensor(self._input["index"], inputs)
        self._interpreter.invoke()
        outputs = self._interpreter.get_tensor(self._output["index"])
        outputs = outputs.reshape(len(inputs), self.feature_dim)
        scale, zero_point = self._output_quantization
        if outputs.dtype.kind in "iu" and scale > 0:
            return scale * (outputs.astype(np.float32) - zero_point)
        return outputs.astype(np.float32)
