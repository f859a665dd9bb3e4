"""SuBiC under a 2-replica `MirroredStrategy` on CPU: its loss and gradients
against one device (`tests/models/test_losses.py`), and the recipe's training
(`tests/trainers/test_recipe.py`).

Run as a script (the logical CPU devices must be configured before TensorFlow
initialises; both checks share one start-up); prints one JSON line,
`{"losses": ..., "recipe": ...}`.
"""

import json

import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()],
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from subic_keras import build_subic  # noqa: E402
from subic_keras.models import losses  # noqa: E402
from subic_keras.trainers import recipe  # noqa: E402

NUM_BLOCKS, BLOCK_SIZE, CLASSES, BATCH = 4, 8, 5, 64


# One strategy for both checks: a second one in the same process would number
# its collective operations from the same start, and TensorFlow would mix
# them up with the first one's.
STRATEGY = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def build():
    keras.utils.set_random_seed(7)
    backbone = keras.Sequential(
        [keras.Input((12,)), keras.layers.Dense(16, activation="relu")], name="mlp"
    )
    subic = build_subic(
        backbone, NUM_BLOCKS, BLOCK_SIZE, CLASSES, gamma=0.7, mu=1.3, optimizer=None
    )
    # Plain SGD with rate 1: a step's weight change is minus the gradient.
    subic.compile(keras.optimizers.SGD(learning_rate=1.0))
    return subic.train_model


def one_step(model, x, y):
    before = [w.numpy() for w in model.trainable_weights]
    history = model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    after = [w.numpy() for w in model.trainable_weights]
    return history.history, [b - a for b, a in zip(before, after)]


def check_losses() -> dict:
    """One SGD step on one device and on 2 replicas, and batch entropies."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, 12)).astype("float32")
    y = rng.integers(0, CLASSES, BATCH)

    single_history, single_grads = one_step(build(), x, y)
    with STRATEGY.scope():
        model = build()
    mirrored_history, mirrored_grads = one_step(model, x, y)

    probs = build().predict(x, verbose=0)["block_probs"]
    halves = [
        losses.batch_block_entropy(half, NUM_BLOCKS, BLOCK_SIZE).numpy()
        for half in np.split(probs, 2)
    ]
    return {
        "replicas": STRATEGY.num_replicas_in_sync,
        "single_loss": single_history["loss"][0],
        "mirrored_loss": mirrored_history["loss"][0],
        "single_batch_term": single_history["block_probs_loss"][0],
        "mirrored_batch_term": mirrored_history["block_probs_loss"][0],
        "max_gradient": float(max(np.abs(g).max() for g in single_grads)),
        "max_gradient_difference": float(
            max(np.abs(a - b).max() for a, b in zip(single_grads, mirrored_grads))
        ),
        "per_replica_batch_entropy": float(np.mean(halves)),
        "global_batch_entropy": float(
            losses.batch_block_entropy(probs, NUM_BLOCKS, BLOCK_SIZE).numpy()
        ),
    }


def check_recipe() -> dict:
    """The recipe (pre-training, then SuBiC) under 2 replicas."""
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=3.0, size=(4, 12))
    labels = rng.integers(0, 4, 400)
    features = (centers[labels] + rng.normal(size=(400, 12))).astype("float32")

    with STRATEGY.scope():
        keras.utils.set_random_seed(0)
        backbone = keras.Sequential(
            [keras.Input((12,)), keras.layers.Dense(16, activation="relu")]
        )
        _, summary = recipe.train_subic(
            backbone,
            4,
            8,
            features[:320],
            labels[:320],
            (features[320:], labels[320:]),
            recipe=recipe.Recipe(
                pretrain_epochs=1, epochs=2, batch_size=32, augment=False
            ),
        )
    return {
        "replicas": STRATEGY.num_replicas_in_sync,
        "best_epoch": summary["best_epoch"],
        "query": summary["query"],
        "validation_map": summary["validation_map"][summary["query"]],
    }


print(json.dumps({"losses": check_losses(), "recipe": check_recipe()}))
