"""Tests for subic_keras.scoring: one evaluation for SuBiC and the baselines."""

import numpy as np
import pytest

from subic_keras import evaluation, retrieval, scoring
from subic_keras.backbones import feature_input
from subic_keras.baselines import ProductQuantizer, Quantizer, build_dsh
from subic_keras.baselines.hashing import HashingNetwork
from subic_keras.models import Subic, build_subic


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 160)
    features = rng.normal(size=(640, 16)).astype(np.float32) + labels[:, None]
    return features, labels


@pytest.fixture(scope="module")
def subic():
    return build_subic(feature_input(16), 4, 8, 4, input_shape=(16,))


def test_every_method_is_a_scorer(subic):
    dsh = build_dsh(feature_input(16), 12, input_shape=(16,))
    for method in (subic, dsh, ProductQuantizer(num_subspaces=4)):
        assert isinstance(method, scoring.Scorer)
    assert isinstance(dsh, HashingNetwork) and issubclass(Quantizer, scoring.Scorer)


def test_subic_scores_are_the_asymmetric_scores(subic, data):
    features, _ = data
    codes = subic.encode_database(features[:50])
    for kind in ("fc0", "class_posterior"):
        view = subic.with_query(kind)
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
    assert subic.default_query == "fc0"
    assert subic.with_query("class_posterior").encoder is subic.encoder


def test_evaluate_is_the_same_for_every_method(subic, data):
    features, labels = data
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
    subic_result = scoring.evaluate(subic, features, labels, "random", **args)
    assert subic_result["query"] == "fc0" and 0 <= subic_result["map"] <= 1
    assert "map_21point" not in scoring.evaluate(
        subic, features, labels, "random", extras=False, **args
    )


def test_retrieval_evaluate_with_an_index_equals_without(subic, data):
    features, labels = data
    _, database_idx = scoring.protocols.protocol_split(
        "random", labels, seed=0, num_queries=40
    )
    index = retrieval.build_index(subic, features[database_idx], ids=database_idx)
    args = {"seed": 0, "num_queries": 40, "query": "class_posterior"}
    with_index = retrieval.evaluate(
        subic, features, labels, "random", index=index, **args
    )
    without = retrieval.evaluate(subic, features, labels, "random", **args)
    assert with_index == without
    with pytest.raises(ValueError, match="index must hold the protocol's database"):
        retrieval.evaluate(
            subic,
            features,
            labels,
            "random",
            index=retrieval.build_index(subic, features[:10]),
            **args,
        )


def test_bad_database_size(subic, data):
    features, labels = data
    with pytest.raises(ValueError, match="database must hold the protocol's 600"):
        scoring.evaluate(
            subic, features, labels, "random", num_queries=40, database=np.zeros((3, 4))
        )
    assert isinstance(subic, Subic)
