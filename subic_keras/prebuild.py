"""Training state built before `fit` traces its first step.

Without a `tf.distribute` strategy, Keras creates a compiled model's
optimizer slots, metric and loss-tracker variables while TensorFlow traces
the first train step. A `tf.function` whose first trace creates variables
is traced a second time without them, so the train step of every new model
is traced twice. Built first from the shapes of the training data, as Keras
itself does under a strategy, it is traced once, which on a CPU about
halves the time a small model waits before its first batch.
"""

from __future__ import annotations

import keras


def build_training_state(model: keras.Model, x, y=None) -> None:
    """Builds `model`'s optimizer, metrics and losses from the shapes of
    `fit`'s data, where they can be read without drawing a batch.

    `x` is `fit`'s `x`: arrays (or a structure of them) with `y`, or a
    `tf.data.Dataset` of batches. Anything else (a generator, a
    `PyDataset`), an uncompiled model, or a model under a strategy is left
    to Keras, which builds the same state in the first step.

    Example:

    >>> inputs = keras.Input((3,))
    >>> model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    >>> model.compile("adam", "mse")
    >>> build_training_state(model, np.zeros((8, 3)), np.zeros((8, 2)))
    >>> model.optimizer.built
    True

    Args:
        model: a compiled Keras model.
        x, y: as `fit`'s.
    """
    # How Keras builds this state under a strategy (`_maybe_symbolic_build`);
    # a private method, so a Keras without it keeps its deferred build.
    build = getattr(model, "_symbolic_build", None)
    if (
        build is None
        or not model.compiled
        or getattr(model, "_distribute_strategy", None) is not None
    ):
        return
    if hasattr(x, "element_spec"):  # a tf.data.Dataset of batches
        batch = x.element_spec
    elif _arrays(x) and (y is None or _arrays(y)):
        batch = (x,) if y is None else (x, y)
    else:
        return
    try:
        build(data_batch=batch)
    except Exception:
        # `fit` builds the same state in its first step and reports what is
        # wrong in the user's data in its own words.
        return


def _arrays(structure) -> bool:
    leaves = keras.tree.flatten(structure)
    return bool(leaves) and all(
        hasattr(leaf, "shape") and hasattr(leaf, "dtype") for leaf in leaves
    )
