"""Binary hashing networks shared by the DSH and DLBHC baselines.

A hashing network maps an image to `B` real values and thresholds them to a
`B`-bit code; codes are compared by Hamming distance, either exhaustively
(`subic_keras.evaluation.hamming_scores`, for full rankings and mAP) or with
faiss's `IndexBinaryFlat` (`hamming_search`, for the top `k`).
"""

from __future__ import annotations

import abc
import numbers

import faiss
import keras
import numpy as np
from keras import ops

from subic_keras._validation import check_int
from subic_keras.data.datasets import as_model_inputs
from subic_keras.data.pixels import ImageModel
from subic_keras.evaluation.retrieval_metrics import hamming_scores
from subic_keras.evaluation.scoring import Scorer
from subic_keras.models.prediction import predict


@keras.saving.register_keras_serializable(package="subic_keras")
class Binarize(keras.layers.Layer):
    """Thresholds its inputs to bits: `1` where `inputs > threshold`, else `0`.

    DSH's codes are `sign(u)` (threshold 0), DLBHC's `sigmoid(·) > 0.5`.
    A value equal to the threshold gives 0, so that the code is a
    deterministic function of its input.

    Example:

    >>> Binarize(0.0)(np.array([[-1.0, 0.0, 2.0]])).numpy()
    array([[0, 0, 1]], dtype=int32)

    Args:
        threshold: the finite threshold.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Returns:
        int32 bits of the input's shape.
    """

    def __init__(self, threshold: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
            raise TypeError(f"threshold must be a real number, received {threshold!r}")
        if not np.isfinite(threshold):
            raise ValueError(f"threshold must be finite, received {threshold}")
        self.threshold = float(threshold)

    def call(self, inputs):
        return ops.cast(ops.greater(inputs, self.threshold), "int32")

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, inputs):
        return keras.KerasTensor(inputs.shape, dtype="int32")

    def get_config(self):
        return {**super().get_config(), "threshold": self.threshold}


def _packed_bits(name: str, bits, packed: bool) -> np.ndarray:
    bits = np.asarray(bits)
    if bits.ndim != 2 or bits.shape[1] == 0:
        raise ValueError(
            f"{name} must be a 2-D array (n, num_bits) with at least one bit, "
            f"received shape {bits.shape}"
        )
    if packed:
        if bits.dtype != np.uint8:
            raise TypeError(
                f"{name} must have dtype uint8 when packed=True, received {bits.dtype}"
            )
        return np.ascontiguousarray(bits)
    if bits.dtype.kind not in "biuf" or not np.all((bits == 0) | (bits == 1)):
        raise ValueError(
            f"{name} must hold bits 0 or 1 (pass packed=True for bytes from "
            "np.packbits)"
        )
    # np.packbits pads the last byte with zeros; zero padding on both sides
    # never adds to a Hamming distance.
    return np.packbits(bits.astype(np.uint8), axis=1)


def hamming_search(
    query_bits: np.ndarray,
    database_bits: np.ndarray,
    k: int,
    *,
    packed: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """The `k` nearest database codes of each query in Hamming distance.

    Exhaustive search with faiss's `IndexBinaryFlat` (popcount of XORs).
    Codes of any length are accepted: they are zero-padded to whole bytes.
    The order among database items at equal distance is faiss's and
    unspecified; for mAP over full rankings with a stated tie rule, use
    `subic_keras.evaluation.hamming_scores` and `mean_average_precision`.

    Example:

    >>> rng = np.random.default_rng(0)
    >>> database_bits = rng.integers(0, 2, size=(100, 48))
    >>> distances, indices = hamming_search(database_bits[:2], database_bits, k=10)
    >>> indices.shape, distances[:, 0].tolist(), indices[:, 0].tolist()
    ((2, 10), [0, 0], [0, 1])

    Args:
        query_bits: `(num_queries, num_bits)` of 0/1 (any integer, bool or
            float dtype), or with `packed=True` uint8 bytes from `np.packbits`
            along axis 1.
        database_bits: `(num_database, num_bits)` in the same form.
        k: neighbours per query, `1 <= k <= num_database`.
        packed: whether the bits are packed 8 per byte (never guessed).

    Returns:
        `(distances, indices)`: int32 and int64 arrays `(num_queries, k)`,
        by increasing distance.

    Raises:
        ValueError: on non-2-D inputs, different code lengths, values other
            than 0/1 when `packed=False`, or `k` out of range.
        TypeError: on a non-uint8 dtype when `packed=True`.
    """
    query = _packed_bits("query_bits", query_bits, packed)
    database = _packed_bits("database_bits", database_bits, packed)
    if query.shape[1] != database.shape[1]:
        raise ValueError(
            "query_bits and database_bits must have the same number of columns, "
            f"received {np.shape(query_bits)[1]} and {np.shape(database_bits)[1]}"
        )
    k = check_int("k", k, minimum=1)
    if k > len(database):
        raise ValueError(
            f"k must be <= the number of database codes ({len(database)}), received {k}"
        )
    index = faiss.IndexBinaryFlat(8 * database.shape[1])
    index.add(database)
    distances, indices = index.search(query, k)
    return distances.astype(np.int32), indices.astype(np.int64)


class HashingNetwork(Scorer):
    """A trained hashing network and its binary encoder (shared weights).

    Attributes:
        train_model: the graph trained with `fit`.
        encoder: `images → bits`, int32 `(batch, B)` of 0/1, thresholding the
            output of the layer named `code_layer`.
        bits: the code length `B`.
        backbone: the feature extractor (the last layer before the head
            layers), or None.

    Args:
        train_model: a functional model with a layer named `code_layer`.
        code_layer: the layer whose outputs are thresholded into bits.
        threshold: the threshold of `Binarize`.
        head: names of the other layers added on top of the backbone.
    """

    def __init__(
        self,
        train_model: keras.Model,
        code_layer: str,
        threshold: float,
        head: tuple[str, ...] = (),
    ):
        if not isinstance(train_model, keras.Model):
            raise TypeError(
                f"train_model must be a keras.Model, received "
                f"{type(train_model).__name__}"
            )
        try:
            codes = train_model.get_layer(code_layer)
        except ValueError as error:
            raise ValueError(
                f"train_model must have a layer named {code_layer!r}, received a "
                f"model named {train_model.name!r} with layers "
                f"{[layer.name for layer in train_model.layers]}"
            ) from error
        self.train_model = train_model
        self.bits = int(codes.output.shape[-1])
        self.encoder = ImageModel(
            train_model.inputs,
            Binarize(threshold, name="bits")(codes.output),
            name="encoder",
        )
        head_names = {code_layer, *head}
        trunk = [
            layer
            for layer in train_model.layers
            if layer.name not in head_names
            and not isinstance(layer, keras.layers.InputLayer)
        ]
        # Functional layers are in topological order: a preprocessing layer,
        # if any, comes before the backbone.
        self.backbone = trunk[-1] if trunk else None

    @abc.abstractmethod
    def compile(self, optimizer="adam", **kwargs) -> keras.Model:
        """Compiles `train_model` with the method's loss; returns it."""

    def encode(self, images, batch_size: int = 256, packed: bool = False) -> np.ndarray:
        """Binary codes of `images`.

        Args:
            images: the network's inputs.
            batch_size: images per prediction batch.
            packed: pack 8 bits per byte with `np.packbits` along axis 1.

        Returns:
            uint8 `(n, B)` of 0/1, or `(n, ceil(B/8))` bytes when `packed`;
            either goes to `hamming_search` or
            `subic_keras.evaluation.hamming_scores` (with the same `packed`).
        """
        bits = predict(self.encoder, images, batch_size, "encoding", False)
        bits = bits.astype(np.uint8)
        return np.packbits(bits, axis=1) if packed else bits

    # Scorer: Hamming ranking of binary codes ------------------------------

    def encode_database(self, inputs) -> np.ndarray:
        """Bits `(n, B)` of uint8 images (scaled to `[0, 1]`) or float inputs."""
        return self.encode(as_model_inputs(inputs))

    def encode_queries(self, inputs) -> np.ndarray:
        """Bits `(n, B)`: hashing searches symmetrically."""
        return self.encode_database(inputs)

    def score(self, queries: np.ndarray, database: np.ndarray) -> np.ndarray:
        """Negated Hamming distances (`evaluation.hamming_scores`)."""
        return hamming_scores(queries, database)

    def describe(self) -> dict:
        return {"bits": self.bits}
