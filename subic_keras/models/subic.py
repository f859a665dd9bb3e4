"""SuBiC networks: one train graph and the test-time views that share its weights.

`s = FC1 ∘ f2 ∘ f1 (I)`: a backbone `f1` gives features `x`; `FC0` (dense,
`M·K` outputs, ReLU) gives `z`; the block softmax gives `b̃` in training and
the block one-hot gives `b` at test time; `FC1` classifies either.

Asymmetric search scores a stored code `b` with a real query `q` of width
`M·K` as `qᵀb`, `M` additions (`search.SubicIndex`). Two queries
(`QUERY_KINDS`):

- `"fc0"`, the paper's (Eq. 9): `q = z*`, the ReLU output of FC0;
- `"class_posterior"`: `q = W₁ s*`, FC1's kernel `W₁ (M·K × C)` applied to
  the query's class posterior `s* = softmax(W₁ᵀ b̃* + c)`, so that
  `qᵀb = Σ_c s*_c (W₁ᵀ b)_c`: the logits FC1 gives the stored code, averaged
  over the classes the query probably belongs to (FC1's bias `c` adds the
  same constant to every item of a query and is left out). Every bin of a
  block then scores by the classes it stands for, including the bins the
  query's own code does not use.
"""

from __future__ import annotations

import copy

import keras
import numpy as np

# Registers the backbones' Keras layers (local response normalization,
# application preprocessing), which SuBiC `.keras` files may hold.
import subic_keras.models.backbones  # noqa: F401
from subic_keras._validation import check_non_negative
from subic_keras.config import QUERY_KINDS as QUERY_KINDS
from subic_keras.data.datasets import as_model_inputs
from subic_keras.data.pixels import ImageModel
from subic_keras.evaluation.scoring import Scorer
from subic_keras.models.layers import BlockArgmax, BlockOneHot
from subic_keras.models.losses import ScaledCrossEntropy, SubicEntropyLoss
from subic_keras.models.metrics import (
    BinUsage,
    MeanBlockEntropy,
    OneHotCloseness,
    SupportEntropy,
    subic_metrics,
)
from subic_keras.models.prediction import predict
from subic_keras.search import SubicIndex

# Names of the head's layers; views are rebuilt from a reloaded model by them.
FC0 = "fc0"
BLOCK_PROBS = "block_probs"
FC1 = "fc1"
CLASS_PROBS = "class_probs"
TRAINING_MODES = ("full", "2-layer", "3-layer")


def check_query_kind(name: str, kind) -> str:
    """`kind` if it is one of `QUERY_KINDS`; a `ValueError` naming `name` otherwise."""
    if kind not in QUERY_KINDS:
        raise ValueError(f"{name} must be one of {QUERY_KINDS}, received {kind!r}")
    return kind


def check_model_inputs(model: keras.Model, images) -> np.ndarray:
    """`images` checked against `model`'s input: uint8 pixels, kept as
    they are (the models scale them, `subic_keras.data.pixels`), or float
    inputs as float32.

    Raises:
        ValueError: for a shape other than `(n, *input_shape)`, or NaN
            or infinite values.
        TypeError: for a dtype other than uint8 or float.
    """
    inputs = np.asarray(images)
    if inputs.dtype != np.uint8:
        inputs = as_model_inputs(inputs)
    elif inputs.ndim == 3:
        inputs = inputs[..., None]  # grey images without a channel axis
    expected = tuple(model.input_shape[1:])
    if inputs.ndim != len(expected) + 1 or any(
        e is not None and e != s for e, s in zip(expected, inputs.shape[1:])
    ):
        raise ValueError(
            "images must have shape (n, "
            + ", ".join(str(e) for e in expected)
            + f"), received {inputs.shape}"
        )
    if inputs.dtype != np.uint8 and not np.all(np.isfinite(inputs)):
        bad = int(inputs.size - np.count_nonzero(np.isfinite(inputs)))
        raise ValueError(
            f"images must be finite, received {bad} NaN or infinite values"
        )
    return inputs


class Subic(Scorer):
    """A SuBiC network: its train model and its weight-sharing test views.

    Build one with `build_subic`, or rebuild it around a reloaded train model
    with `Subic.from_train_model`.

    Attributes:
        train_model: `images → {"class_probs": s, "block_probs": b̃}`, the
            graph trained with `fit`; compile it with `compile()`.
        query_encoder: `images → z`, the ReLU output of FC0 `(batch, M·K)`,
            the real-valued query of asymmetric search (the paper's).
        class_query_encoder: `images → W₁ s` `(batch, M·K)`, the
            class-posterior query (module docstring).
        encoder: `images → codes`, int32 `(batch, M)`, the per-block argmax.
        classifier: `images → class probabilities` from the binary code `b`.
        code_classifier: one-hot codes `b` `(batch, M·K)` → class
            probabilities, to classify stored codes without their images.
        backbone: the feature extractor `f1`.
        default_query: the query kind `query` uses when given none; the
            recipe (`subic_keras.trainers.recipe`) chooses it on validation data and
            it is saved with `train_model`.

    A `Subic` is a `subic_keras.evaluation.scoring.Scorer`: `encode_database` gives
    codes, `encode_queries` queries of kind `default_query` (`with_query`
    picks the other), and `score` is the asymmetric `M`-addition score of
    `SubicIndex`, so `subic_keras.evaluation.scoring.evaluate` scores it like any
    baseline.
    """

    _query: str | None = None
    # `encode`, `query` and `code_statistics` show a progress bar on a
    # terminal's standard error (set by the command line).
    show_progress = False

    def __init__(self, train_model: keras.Model, gamma: float = 0.3, mu: float = 0.3):
        try:
            fc0 = train_model.get_layer(FC0)
            block = train_model.get_layer(BLOCK_PROBS)
            fc1 = train_model.get_layer(FC1)
        except ValueError as error:
            raise ValueError(
                "train_model must be a SuBiC train model with layers named "
                f"{FC0!r}, {BLOCK_PROBS!r} and {FC1!r}, received a model named "
                f"{train_model.name!r} with layers "
                f"{[layer.name for layer in train_model.layers]}"
            ) from error
        self.train_model = train_model
        self.num_blocks = block.num_blocks
        self.block_size = block.block_size
        self.num_classes = fc1.units
        self.gamma = check_non_negative("gamma", gamma)
        self.mu = check_non_negative("mu", mu)
        head = {FC0, BLOCK_PROBS, FC1, CLASS_PROBS}
        trunk = [
            layer
            for layer in train_model.layers
            if layer.name not in head and not isinstance(layer, keras.layers.InputLayer)
        ]
        # Functional layers are in topological order: a preprocessing layer,
        # if any, comes before the backbone that feeds FC0.
        self.backbone = trunk[-1] if trunk else None

        inputs = train_model.inputs
        z = fc0.output
        m, k = self.num_blocks, self.block_size
        self.query_encoder = ImageModel(inputs, z, name="query_encoder")
        posterior = train_model.get_layer(CLASS_PROBS).output
        self.class_query_encoder = ImageModel(
            inputs,
            _ClassPosteriorQuery(fc1, name="class_posterior_query")(posterior),
            name="class_query_encoder",
        )
        self.encoder = ImageModel(
            inputs, BlockArgmax(m, k, name="codes")(z), name="encoder"
        )
        binary = BlockOneHot(m, k, name="block_one_hot")(z)
        self.classifier = ImageModel(
            inputs, softmax(fc1(binary), "binary_class_probs"), name="classifier"
        )
        codes = keras.Input((m * k,), name="one_hot_codes")
        self.code_classifier = keras.Model(
            codes, softmax(fc1(codes), "code_class_probs"), name="code_classifier"
        )

    @classmethod
    def from_train_model(cls, train_model: keras.Model) -> Subic:
        """Rebuilds every view around a (reloaded) train model.

        `γ` and `μ` are read back from the compiled `SubicEntropyLoss` loss when
        the model was saved compiled, and default to `build_subic`'s (0.3) otherwise.

        Example:

        >>> build_subic(backbones.dsh_cnn(), 4, 16, 10).train_model.save("subic.keras")
        >>> model = keras.saving.load_model("subic.keras")
        >>> subic = Subic.from_train_model(model)
        >>> subic.encode(images / 255).shape   # uint8 images `(n, 32, 32, 3)`
        (64, 4)
        """
        loss = getattr(train_model, "loss", None)
        entropy = loss.get(BLOCK_PROBS) if isinstance(loss, dict) else None
        return cls(
            train_model,
            gamma=getattr(entropy, "gamma", 0.3),
            mu=getattr(entropy, "mu", 0.3),
        )

    @property
    def default_query(self) -> str:
        if self._query is not None:
            return self._query
        return getattr(self.train_model, "default_query", QUERY_KINDS[0])

    @default_query.setter
    def default_query(self, kind: str) -> None:
        self.train_model.default_query = check_query_kind("default_query", kind)
        self._query = None

    def with_query(self, kind: str) -> Subic:
        """This model with queries of `kind` (`"fc0"` or `"class_posterior"`).

        The copy shares every model and weight; only the query it searches
        with (`query`, `encode_queries`) differs.
        """
        view = copy.copy(self)
        view._query = check_query_kind("kind", kind)
        return view

    # Scorer ---------------------------------------------------------------

    def encode_database(self, inputs) -> np.ndarray:
        """Codes `(n, M)` of uint8 images (scaled to `[0, 1]`) or float inputs."""
        return self.encode(inputs)

    def encode_queries(self, inputs) -> np.ndarray:
        """Queries `(n, M·K)` of kind `default_query` (inputs as `encode_database`)."""
        return self.query(inputs)

    def score(self, queries: np.ndarray, database: np.ndarray) -> np.ndarray:
        """Asymmetric scores `sum_m q[m*K + c_m]` (paper Sec. 3.3), `(nq, n)`."""
        index = SubicIndex(self.num_blocks, self.block_size)
        index.add(database)
        return index.score_all(queries)[0]

    def describe(self) -> dict:
        return {
            "query": self.default_query,
            "bits": self.num_blocks * (self.block_size.bit_length() - 1),
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
        }

    def losses(self) -> dict:
        """SuBiC's loss, per output: scaled cross-entropy and both entropies."""
        return {
            CLASS_PROBS: ScaledCrossEntropy(),
            BLOCK_PROBS: SubicEntropyLoss(
                self.num_blocks, self.block_size, gamma=self.gamma, mu=self.mu
            ),
        }

    def metrics(self) -> dict:
        """Accuracy on the class output and the code metrics on `block_probs`."""
        return {
            CLASS_PROBS: [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            BLOCK_PROBS: subic_metrics(self.num_blocks, self.block_size),
        }

    def compile(self, optimizer="adam", **kwargs) -> keras.Model:
        """Compiles `train_model` with SuBiC's losses and metrics.

        Args:
            optimizer: any Keras optimizer or its name.
            **kwargs: passed to `keras.Model.compile` (`loss` and `metrics`
                override SuBiC's).

        Returns:
            The compiled `train_model`.
        """
        kwargs.setdefault("loss", self.losses())
        kwargs.setdefault("metrics", self.metrics())
        self.train_model.compile(optimizer=optimizer, **kwargs)
        return self.train_model

    def set_training_mode(self, mode: str) -> None:
        """Chooses which weights train: the paper's 2-layer, 3-layer or full.

        - `"2-layer"`: FC0 and FC1 only, on a frozen backbone;
        - `"3-layer"`: also the backbone's last layer that has weights;
        - `"full"`: everything.

        A compiled train model is recompiled from its compile config (with a
        fresh optimizer state), since Keras fixes the trained variables when
        it first builds the optimizer.

        Args:
            mode: one of `"full"`, `"2-layer"`, `"3-layer"`.
        """
        if mode not in TRAINING_MODES:
            raise ValueError(f"mode must be one of {TRAINING_MODES}, received {mode!r}")
        if self.backbone is None:
            raise ValueError("set_training_mode needs a backbone; this model has none")
        leaves = leaf_layers(self.backbone)
        for layer in leaves:
            layer.trainable = mode != "2-layer"
        self.backbone.trainable = mode != "2-layer"
        if mode == "3-layer":
            weighted = [layer for layer in leaves if layer.trainable_weights]
            if not weighted:
                raise ValueError(
                    "3-layer training needs a backbone whose last layer has "
                    f"trainable weights, received {self.backbone.name!r} with none"
                )
            for layer in leaves:
                layer.trainable = layer is weighted[-1]
        if self.train_model.compiled:
            self.train_model.compile_from_config(self.train_model.get_compile_config())

    def model_inputs(self, images) -> np.ndarray:
        """`check_model_inputs` for this model."""
        return check_model_inputs(self.train_model, images)

    def stream_inputs(self, images, batch_size: int = 256):
        """A `tf.data.Dataset` of pictures as batches this model predicts on.

        The dataset may hold images or `(image, label, ...)` tuples, batched
        or not; labels are dropped. Pictures are uint8 (scaled inside the
        model) or floats in `[0, 1]`. Nothing is materialised: batches flow
        from the dataset to the model.

        Returns:
            The batched dataset of images, or `None` if `images` is not a
            `tf.data.Dataset` (arrays take `model_inputs`).

        Raises:
            ValueError: for elements of another shape than the model's input.
            TypeError: for a dtype other than uint8 or float.
        """
        import tensorflow as tf

        if not isinstance(images, tf.data.Dataset):
            return None
        spec = images.element_spec
        if isinstance(spec, tuple):
            images = images.map(
                tf.autograph.experimental.do_not_convert(lambda image, *rest: image)
            )
            spec = spec[0]
        expected = tuple(self.train_model.input_shape[1:])
        shape = tuple(spec.shape)
        if len(shape) == len(expected):
            images = images.batch(batch_size)
            shape = (None, *shape)
        if len(shape) != len(expected) + 1 or any(
            e is not None and s is not None and e != s
            for e, s in zip(expected, shape[1:])
        ):
            raise ValueError(
                f"the dataset's images must have shape {expected} (or batches of "
                f"it), received elements of shape {tuple(spec.shape)}"
            )
        if spec.dtype != tf.uint8 and not spec.dtype.is_floating:
            raise TypeError(
                "the dataset's images must be uint8 pixels or floats in [0, 1], "
                f"received {spec.dtype.name}"
            )
        return images.prefetch(tf.data.AUTOTUNE)

    def _predict(self, model, inputs, batch_size: int, description: str):
        return predict(model, inputs, batch_size, description, self.show_progress)

    def encode(self, images, batch_size: int = 256) -> np.ndarray:
        """Integer codes `(n, M)` int32 of `images`: uint8 or float arrays, or
        a `tf.data.Dataset` of them (`stream_inputs`)."""
        stream = self.stream_inputs(images, batch_size)
        if stream is not None:
            return self._predict(self.encoder, stream, batch_size, "encoding")
        inputs = self.model_inputs(images)
        if not len(inputs):
            return np.zeros((0, self.num_blocks), np.int32)
        return self._predict(self.encoder, inputs, batch_size, "encoding")

    def features(self, images, batch_size: int = 256) -> np.ndarray:
        """The backbone's features of `images`, FC0's input `(n, d)`: what
        the unsupervised baselines quantize (`baselines.ProductQuantizer`)."""
        fc0 = self.train_model.get_layer(FC0)
        model = ImageModel(self.train_model.inputs, fc0.input, name="features")
        inputs = self.model_inputs(images)
        return np.asarray(self._predict(model, inputs, batch_size, "features"))

    def query(
        self, images, batch_size: int = 256, kind: str | None = None
    ) -> np.ndarray:
        """Real-valued queries `(n, M·K)` of asymmetric search.

        Args:
            images: uint8 images (scaled to `[0, 1]`) or float model inputs,
                as arrays or a `tf.data.Dataset` (`stream_inputs`).
            batch_size: prediction batch size.
            kind: `"fc0"` for the paper's `z` (`query_encoder`),
                `"class_posterior"` for `W₁ s` (`class_query_encoder`), or
                `None` for the model's `default_query`.

        Returns:
            float32 queries for `SubicIndex.search`.
        """
        kind = check_query_kind("kind", self.default_query if kind is None else kind)
        encoder = self.query_encoder if kind == "fc0" else self.class_query_encoder
        stream = self.stream_inputs(images, batch_size)
        if stream is not None:
            return self._predict(encoder, stream, batch_size, "queries")
        inputs = self.model_inputs(images)
        if not len(inputs):
            return np.zeros((0, self.num_blocks * self.block_size), np.float32)
        return self._predict(encoder, inputs, batch_size, "queries")

    def query_model(self, kind: str | None = None) -> ImageModel:
        """`images → (queries, class probabilities)`: one forward pass for both.

        What a search service answers a picture with: its query of kind
        `kind` (`None`: `default_query`) and FC1's class posterior
        `s* = softmax(W₁ᵀ b̃* + c)` on its block softmax. Shares every weight.

        Example:

        >>> subic = build_subic(backbones.dsh_cnn(), 4, 16, 10)
        >>> queries, probs = subic.query_model()(np.zeros((2, 32, 32, 3), np.uint8))
        >>> tuple(queries.shape), tuple(probs.shape)
        ((2, 64), (2, 10))
        """
        kind = check_query_kind("kind", self.default_query if kind is None else kind)
        encoder = self.query_encoder if kind == "fc0" else self.class_query_encoder
        posterior = self.train_model.get_layer(CLASS_PROBS).output
        return ImageModel(
            self.train_model.inputs,
            [encoder.outputs[0], posterior],
            name=f"{kind}_query_model",
        )

    def code_statistics(self, images, labels=None, batch_size: int = 256) -> dict:
        """How well the codes use their bits, on `images` (the paper's Fig. 3).

        Reported, never used for selection: they explain a mAP, e.g. blocks
        that use few bins, or saturated blocks (entropy near 0 bits, large
        `z`) that stop learning.

        Args:
            images: model inputs (uint8 images are scaled to `[0, 1]`).
            labels: class ids `(n,)`; adds FC1's accuracy on `b̃` and `b`.
            batch_size: prediction batch size.

        Returns:
            A JSON-ready dict: `mean_block_entropy_bits` (the mean code
            entropy `E(b̃) = Σ_m E(b̃_m)`, the mean-entropy term of Eq. 6),
            `support_entropy_bits` (the entropy of each block's histogram of
            bins of `b`, averaged over blocks; `log2 K` is uniform usage),
            `bins_used_per_block`, `sorted_first_block` (the mean of `b̃_1`
            sorted in each image, Fig. 3 left), `first_block_support_sorted`
            and `first_block_bins_used` (Fig. 3 right), `mean_max_z`, and
            with `labels` `accuracy_soft` and `accuracy_binary`.
        """
        inputs = self.model_inputs(images)
        outputs = self._predict(self.train_model, inputs, batch_size, "statistics")
        probs = outputs["block_probs"]
        m, k = self.num_blocks, self.block_size
        closeness = OneHotCloseness(m, k, block_index=0)
        usage = BinUsage(m, k)
        entropy = MeanBlockEntropy(m, k)
        support = SupportEntropy(m, k)
        for metric in (closeness, usage, entropy, support):
            metric.update_state(None, probs)
        histogram = usage.histogram()
        first = np.sort(histogram[0])[::-1]
        z = self.query(inputs, batch_size, kind="fc0").reshape(-1, m, k)
        result = {
            "mean_block_entropy_bits": float(entropy.result()),
            "support_entropy_bits": float(support.result()),
            "bins_used_per_block": [int(v) for v in np.count_nonzero(histogram, 1)],
            "sorted_first_block": [float(v) for v in closeness.sorted_block()],
            "first_block_support_sorted": [int(v) for v in first],
            "first_block_bins_used": int(np.count_nonzero(first)),
            "mean_max_z": float(z.max(-1).mean()),
        }
        if labels is not None:
            labels = np.asarray(labels)
            if labels.shape != (len(inputs),):
                raise ValueError(
                    f"labels must have shape ({len(inputs)},), one class id per "
                    f"image, received {labels.shape}"
                )
            binary = predict(self.classifier, inputs, batch_size, "classes", False)
            soft = outputs["class_probs"].argmax(-1)
            result["accuracy_soft"] = float(np.mean(soft == labels))
            result["accuracy_binary"] = float(np.mean(binary.argmax(-1) == labels))
        return result


class _ClassPosteriorQuery(keras.layers.Layer):
    """`s → s W₁ᵀ`: class scores mapped back through FC1's (shared) kernel."""

    def __init__(self, fc1: keras.layers.Dense, **kwargs):
        # float32 like the class probabilities it reads, and the queries
        # every other view returns.
        super().__init__(dtype="float32", **kwargs)
        self.fc1 = fc1

    def call(self, posterior):
        kernel = keras.ops.cast(self.fc1.kernel, "float32")
        return keras.ops.matmul(posterior, keras.ops.transpose(kernel))

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.fc1.kernel.shape[0])


def float32_copy(subic: Subic) -> Subic:
    """`subic` computing in float32: for a model trained in mixed precision.

    Under a `mixed_float16` policy the variables are float32 already and
    only the computations are float16; the copy has every layer's policy
    set to float32 and the same weights, so it encodes, searches and
    exports as a model trained in float32 would.

    Example:

    >>> keras.mixed_precision.set_global_policy("mixed_float16")
    >>> mixed = build_subic(backbones.dsh_cnn(), 4, 16, 10)
    >>> keras.mixed_precision.set_global_policy("float32")
    >>> float32_copy(mixed).query_encoder.output.dtype
    'float32'
    """

    def plain(node):
        if isinstance(node, dict):
            if node.get("class_name") == "DTypePolicy":
                return {**node, "config": {**node["config"], "name": "float32"}}
            return {key: plain(value) for key, value in node.items()}
        if isinstance(node, list):
            return [plain(value) for value in node]
        return node

    config = plain(keras.saving.serialize_keras_object(subic.train_model))
    copy = keras.saving.deserialize_keras_object(config)
    copy.set_weights(subic.train_model.get_weights())
    return Subic(copy, gamma=subic.gamma, mu=subic.mu)


def softmax(logits, name: str):
    """A softmax layer of float32 output (Keras's advice under mixed
    precision), applied to `logits`."""
    # float32 class probabilities under mixed precision, as Keras advises.
    return keras.layers.Activation("softmax", dtype="float32", name=name)(logits)


def leaf_layers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """The layers of a possibly nested model, depth first, in order.

    Example:

    >>> [layer.name for layer in leaf_layers(keras.Sequential([
    ...     keras.Input((4,)), keras.layers.Dense(2, name="d")]))]
    ['d']
    """
    children = getattr(layer, "layers", None)
    if not children:
        return [layer]
    return [leaf for child in children for leaf in leaf_layers(child)]
