"""The uncompressed reference scorer (`subic_keras.baselines.Uncompressed`)."""

import numpy as np
import pytest

from subic_keras.baselines import Uncompressed
from subic_keras.evaluation import scoring


def test_l2_scores_are_negative_squared_distances():
    rng = np.random.default_rng(0)
    queries, database = rng.normal(size=(5, 7)), rng.normal(size=(30, 7))
    expected = -np.square(queries[:, None, :] - database[None]).sum(-1)
    scorer = Uncompressed("l2")
    scores = scorer.score(
        scorer.encode_queries(queries), scorer.encode_database(database)
    )
    np.testing.assert_allclose(scores, expected, atol=1e-5)


def test_cosine_scores_ignore_norms_and_keep_zero_vectors_finite():
    database = np.array([[2.0, 0.0], [0.0, 5.0], [0.0, 0.0]])
    scores = Uncompressed("cosine").score(np.array([[3.0, 3.0]]), database)
    np.testing.assert_allclose(scores, [[np.sqrt(0.5), np.sqrt(0.5), 0.0]])


def test_evaluate_ranks_clustered_features_well():
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(3), 40)
    features = rng.normal(size=(120, 4)) * 0.1 + np.eye(4)[labels]
    result = scoring.evaluate(
        Uncompressed("cosine"), features, labels, "random", num_queries=12, ks=(5,)
    )
    assert result["map"] == pytest.approx(1.0)
    assert result["metric"] == "cosine"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: Uncompressed("hamming"), "metric must be one of"),
        (
            lambda: Uncompressed().score(np.ones((1, 3)), np.ones((2, 4))),
            "queries must have 4 columns",
        ),
        (lambda: Uncompressed().encode_database(np.ones(4)), "received shape \\(4,\\)"),
        (
            lambda: Uncompressed().encode_queries(np.array([[np.nan, 1.0]])),
            "1 NaN or infinite",
        ),
    ],
)
def test_bad_input_names_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()
