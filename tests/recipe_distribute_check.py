"""Trains SuBiC with the recipe under a 2-replica `MirroredStrategy` on CPU.

Run as a script (the logical CPU devices must be configured before TensorFlow
initialises); prints one JSON line.
"""

import json

import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()],
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from subic_keras import recipe  # noqa: E402

rng = np.random.default_rng(0)
centers = rng.normal(scale=3.0, size=(4, 12))
labels = rng.integers(0, 4, 400)
features = (centers[labels] + rng.normal(size=(400, 12))).astype("float32")

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    keras.utils.set_random_seed(0)
    backbone = keras.Sequential(
        [keras.Input((12,)), keras.layers.Dense(16, activation="relu")]
    )
    subic, summary = recipe.train_subic(
        backbone,
        4,
        8,
        features[:320],
        labels[:320],
        (features[320:], labels[320:]),
        recipe=recipe.Recipe(pretrain_epochs=1, epochs=2, batch_size=32, augment=False),
    )
print(
    json.dumps(
        {
            "replicas": strategy.num_replicas_in_sync,
            "best_epoch": summary["best_epoch"],
            "query": summary["query"],
            "validation_map": summary["validation_map"][summary["query"]],
        }
    )
)
