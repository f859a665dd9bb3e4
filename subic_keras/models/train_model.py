"""`SubicTrainModel`: SuBiC's train graph, the model `model.fit` trains.

Its block softmax feeds both the classifier and the entropy terms of the
loss (paper Eq. 8); it shares every weight with the `Subic` test graph
that `build_subic` returns beside it.
"""

from __future__ import annotations

import keras

from subic_keras.config import QUERY_KINDS
from subic_keras.data.pixels import ImageModel
from subic_keras.models.subic import check_query_kind


@keras.saving.register_keras_serializable(package="subic_keras")
class SubicTrainModel(ImageModel):
    """SuBiC's functional train graph, outputs `class_probs` and `block_probs`.

    A functional `ImageModel` (it takes uint8 pixels or `[0, 1]` floats) with
    two conveniences: when `y` is a single tensor of class labels, it is
    given as the target of every output, so `fit(images, labels)` works
    although the entropy losses and the code metrics on `block_probs` need no
    target; and it carries `default_query`, the query kind (`QUERY_KINDS`)
    chosen for this model on validation data, saved with it in its `.keras`
    file (`"fc0"` when never set), `class_names`, the names of its
    classes when they are known (`None` otherwise), and `data_source`, the
    data it was trained on (`{"dataset": …, "data_dir": …, "images": …}`,
    recorded by `subic train`, which the other commands default to), saved
    likewise.
    """

    default_query = QUERY_KINDS[0]
    # The names of the classes, when known (a folder's subfolders).
    class_names: list[str] | None = None
    data_source: dict | None = None

    def get_config(self):
        config = super().get_config()
        config["default_query"] = self.default_query
        config["class_names"] = self.class_names
        config["data_source"] = self.data_source
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        query = check_query_kind(
            "default_query", config.pop("default_query", QUERY_KINDS[0])
        )
        names = config.pop("class_names", None)
        source = config.pop("data_source", None)
        if source is not None and not (
            isinstance(source, dict)
            and all(
                isinstance(k, str) and (v is None or isinstance(v, str))
                for k, v in source.items()
            )
        ):
            raise ValueError(f"data_source must map str to str, received {source!r}")
        if names is not None and not (
            isinstance(names, list) and all(isinstance(n, str) for n in names)
        ):
            raise ValueError(f"class_names must be a list of str, received {names!r}")
        model = super().from_config(config, custom_objects=custom_objects)
        model.default_query = query
        model.class_names = names
        model.data_source = source
        return model

    def _targets(self, y, y_pred):
        if isinstance(y_pred, dict) and y is not None and not isinstance(y, dict):
            return {name: y for name in y_pred}
        return y

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **kwargs):
        y = self._targets(y, y_pred)
        return super().compute_loss(x, y, y_pred, sample_weight, **kwargs)

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        return super().compute_metrics(
            x, self._targets(y, y_pred), y_pred, sample_weight
        )
