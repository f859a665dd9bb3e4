"""`subic_keras.serving.retrieval`: SuBiC's retrieval through a `SubicIndex`."""

import numpy as np
import pytest

from subic_keras.evaluation import scoring
from subic_keras.serving import retrieval


def test_full_scores_are_subic_scores_in_id_order(feature_subic, feature_data):
    features, _ = feature_data
    ids = np.arange(100)[::-1] * 3  # decreasing ids: columns must be re-sorted
    index = retrieval.build_index(feature_subic, features[:100], ids=ids)
    queries = feature_subic.query(features[100:105])
    scores, found_ids = retrieval.full_scores(index, queries)
    np.testing.assert_array_equal(found_ids, np.sort(ids))
    expected = feature_subic.score(queries, feature_subic.encode(features[:100]))[
        :, ::-1
    ]
    np.testing.assert_allclose(scores, expected, rtol=1e-6)


def test_retrieval_evaluate_with_an_index_equals_without(feature_subic, feature_data):
    features, labels = feature_data
    _, database_idx = scoring.protocols.protocol_split(
        "random", labels, seed=0, num_queries=40
    )
    index = retrieval.build_index(
        feature_subic, features[database_idx], ids=database_idx
    )
    args = {"seed": 0, "num_queries": 40, "query": "class_posterior"}
    with_index = retrieval.evaluate(
        feature_subic, features, labels, "random", index=index, **args
    )
    without = retrieval.evaluate(feature_subic, features, labels, "random", **args)
    assert with_index == without
    # An index of every item serves the protocol's database from it.
    whole = retrieval.build_index(feature_subic, features)
    assert (
        retrieval.evaluate(
            feature_subic, features, labels, "random", index=whole, **args
        )
        == without
    )
    with pytest.raises(ValueError, match="index must hold the protocol's database"):
        retrieval.evaluate(
            feature_subic,
            features,
            labels,
            "random",
            index=retrieval.build_index(feature_subic, features[:10]),
            **args,
        )
