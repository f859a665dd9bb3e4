"""Tests for subic_keras.evaluation.scoring: one evaluation for SuBiC and the
baselines."""

import numpy as np
import pytest

from subic_keras.baselines import ProductQuantizer, Quantizer, build_dsh
from subic_keras.baselines.hashing import HashingNetwork
from subic_keras.evaluation import retrieval_metrics as evaluation
from subic_keras.evaluation import scoring
from subic_keras.models.backbones import feature_input
from subic_keras.models.subic import Subic


def test_every_method_is_a_scorer(feature_subic):
    dsh = build_dsh(feature_input(16), 12, input_shape=(16,))
    for method in (feature_subic, dsh, ProductQuantizer(num_subspaces=4)):
        assert isinstance(method, scoring.Scorer)
    assert isinstance(dsh, HashingNetwork) and issubclass(Quantizer, scoring.Scorer)


def test_subic_scores_are_the_asymmetric_scores(feature_subic, feature_data):
    features, _ = feature_data
    codes = feature_subic.encode_database(features[:50])
    for kind in ("fc0", "class_posterior"):
        view = feature_subic.with_query(kind)
        queries = view.encode_queries(features[50:60])
        np.testing.assert_allclose(
            view.score(queries, codes),
            evaluation.asymmetric_scores(queries, codes, 4, 8),
            rtol=1e-5,
            atol=1e-5,
        )
        assert view.describe() == {
            "query": kind,
            "bits": 12,
            "num_blocks": 4,
            "block_size": 8,
        }
    # The views share the model but not the query kind.
    assert feature_subic.default_query == "fc0"
    assert feature_subic.with_query("class_posterior").encoder is feature_subic.encoder


def test_evaluate_is_the_same_for_every_method(feature_subic, feature_data):
    features, labels = feature_data
    pq = ProductQuantizer(num_subspaces=4, bits_per_subspace=4).fit(features)
    args = {"num_queries": 40, "ks": (10,)}
    result = scoring.evaluate(pq, features, labels, "random", seed=1, **args)
    query_idx, database_idx = scoring.protocols.protocol_split(
        "random", labels, seed=1, num_queries=40
    )
    scores = pq.asymmetric_scores(
        features[query_idx], pq.encode(features[database_idx])
    )
    expected = evaluation.mean_average_precision(
        scores, labels[query_idx], labels[database_idx]
    )
    assert result["map"] == pytest.approx(expected)
    assert result["bits"] == 16 and result["num_database"] == 600
    assert {"map_expected", "map_21point", "precision@10"} <= set(result)
    subic_result = scoring.evaluate(feature_subic, features, labels, "random", **args)
    assert subic_result["query"] == "fc0" and 0 <= subic_result["map"] <= 1
    assert "map_21point" not in scoring.evaluate(
        feature_subic, features, labels, "random", extras=False, **args
    )


def test_bad_database_size(feature_subic, feature_data):
    features, labels = feature_data
    with pytest.raises(ValueError, match="database must hold the protocol's 600"):
        scoring.evaluate(
            feature_subic,
            features,
            labels,
            "random",
            num_queries=40,
            database=np.zeros((3, 4)),
        )
    assert isinstance(feature_subic, Subic)
