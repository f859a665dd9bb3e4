import keras
import numpy as np
import pytest
import tensorflow as tf
from reference import block_softmax

from subic_keras import BlockArgmax, BlockOneHot, BlockSoftmax

SHAPES = [(1, 2), (4, 8), (8, 64), (3, 256)]


@pytest.mark.parametrize("num_blocks,block_size", SHAPES)
def test_block_softmax_matches_reference(num_blocks, block_size):
    z = np.random.default_rng(0).normal(size=(5, num_blocks * block_size)) * 4
    out = BlockSoftmax(num_blocks, block_size)(z.astype("float32")).numpy()
    np.testing.assert_allclose(
        out, block_softmax(z, num_blocks, block_size), rtol=1e-5, atol=1e-7
    )
    sums = out.reshape(5, num_blocks, block_size).sum(-1)
    np.testing.assert_allclose(sums, 1.0, rtol=1e-5)


@pytest.mark.parametrize("num_blocks,block_size", SHAPES)
def test_one_hot_and_argmax_agree_with_numpy(num_blocks, block_size):
    z = (
        np.random.default_rng(1)
        .normal(size=(7, num_blocks * block_size))
        .astype("float32")
    )
    codes = BlockArgmax(num_blocks, block_size)(z).numpy()
    expected = z.reshape(7, num_blocks, block_size).argmax(-1)
    np.testing.assert_array_equal(codes, expected)
    assert codes.dtype == np.int32
    one_hot = BlockOneHot(num_blocks, block_size)(z).numpy()
    np.testing.assert_array_equal(
        one_hot, np.eye(block_size)[expected].reshape(7, -1).astype("float32")
    )
    # bBinEnc(z) = bBinEnc(b̃): the softmax keeps each block's argmax.
    soft = BlockSoftmax(num_blocks, block_size)(z)
    np.testing.assert_array_equal(
        BlockOneHot(num_blocks, block_size)(soft).numpy(), one_hot
    )


def test_ties_break_toward_lowest_index():
    z = np.array(
        [[0.0, 0.0, 0.0, 0.0, 0.3, 0.7, 0.7, 0.1, 2.0, 1.0, 2.0, 2.0]], "float32"
    )
    np.testing.assert_array_equal(BlockArgmax(3, 4)(z).numpy(), [[0, 1, 0]])
    expected = np.zeros((1, 12), "float32")
    expected[0, [0, 5, 8]] = 1
    np.testing.assert_array_equal(BlockOneHot(3, 4)(z).numpy(), expected)


def test_layers_accept_extra_leading_dimensions():
    z = np.random.default_rng(2).normal(size=(2, 3, 8)).astype("float32")
    assert BlockArgmax(2, 4)(z).shape == (2, 3, 2)
    assert BlockSoftmax(2, 4)(z).shape == (2, 3, 8)


def test_mixed_precision():
    z = np.random.default_rng(3).normal(size=(4, 16)).astype("float32") * 3
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        soft = BlockSoftmax(2, 8)(z)
        one_hot = BlockOneHot(2, 8)(z)
        codes = BlockArgmax(2, 8)(z)
    finally:
        keras.mixed_precision.set_global_policy(policy)
    assert soft.dtype == tf.float16 and one_hot.dtype == tf.float16
    assert codes.dtype == tf.int32
    np.testing.assert_allclose(soft.numpy(), block_softmax(z, 2, 8), atol=1e-3)
    assert np.all(np.isfinite(soft.numpy()))
    np.testing.assert_array_equal(codes.numpy(), z.reshape(4, 2, 8).argmax(-1))


@pytest.mark.parametrize("cls", [BlockSoftmax, BlockOneHot, BlockArgmax])
def test_config_round_trip(cls):
    layer = cls(num_blocks=3, block_size=16, name="blocks")
    clone = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(layer)
    )
    assert type(clone) is cls
    assert (clone.num_blocks, clone.block_size, clone.name) == (3, 16, "blocks")


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (
            {"num_blocks": 0, "block_size": 4},
            ValueError,
            "num_blocks must be >= 1, received 0",
        ),
        (
            {"num_blocks": 2, "block_size": 1},
            ValueError,
            "block_size must be >= 2, received 1",
        ),
        (
            {"num_blocks": 2.5, "block_size": 4},
            TypeError,
            "num_blocks must be an integer",
        ),
        ({"num_blocks": "2", "block_size": 4}, TypeError, "received '2'"),
        (
            {"num_blocks": True, "block_size": 4},
            TypeError,
            "num_blocks must be an integer",
        ),
        ({"num_blocks": 2, "block_size": -4}, ValueError, "block_size must be >= 2"),
    ],
)
@pytest.mark.parametrize("cls", [BlockSoftmax, BlockOneHot, BlockArgmax])
def test_bad_block_shapes(cls, kwargs, error, message):
    with pytest.raises(error, match=message):
        cls(**kwargs)


@pytest.mark.parametrize("cls", [BlockSoftmax, BlockOneHot, BlockArgmax])
def test_wrong_input_width(cls):
    with pytest.raises(
        ValueError, match=r"num_blocks \* block_size = 2 \* 4 = 8, received 9"
    ):
        cls(2, 4)(np.zeros((1, 9), "float32"))
    with pytest.raises(ValueError, match="received 9"):
        cls(2, 4)(keras.Input((9,)))


def _convert(model):
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter.convert()


def test_litert_conversion_builtin_ops_only():
    litert = pytest.importorskip("ai_edge_litert.interpreter")
    inputs = keras.Input((24,))
    model = keras.Model(
        inputs,
        [
            BlockSoftmax(3, 8)(inputs),
            BlockOneHot(3, 8)(inputs),
            BlockArgmax(3, 8)(inputs),
        ],
    )
    flatbuffer = _convert(model)
    interpreter = litert.Interpreter(model_content=flatbuffer)
    ops = {op["op_name"] for op in interpreter._get_ops_details()}
    assert not any("FLEX" in name or "CUSTOM" in name for name in ops), ops
    z = np.random.default_rng(4).normal(size=(1, 24)).astype("float32")
    z[0, 8:12] = 1.5  # a tie inside block 1
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], z)
    interpreter.invoke()
    outputs = [
        interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()
    ]
    expected = [t.numpy() for t in model(z)]
    matched = 0
    for want in expected:
        for got in outputs:
            if got.shape == want.shape and got.dtype == want.dtype:
                if np.allclose(got, want, atol=1e-6):
                    matched += 1
                    break
    assert matched == 3


def test_argmax_of_a_nan_block_stays_in_range():
    z = np.array([[np.nan, np.nan, np.nan, np.nan, 0.0, 3.0, 1.0, 3.0]], "float32")
    codes = np.asarray(BlockArgmax(num_blocks=2, block_size=4)(z))
    assert codes.tolist() == [[3, 1]]
