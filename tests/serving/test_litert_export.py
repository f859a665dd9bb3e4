"""Tests of subic_keras.serving.export's LiteRT files, checked with LiteRT's
own interpreter against Keras."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from exported import K, M, reference_codes, tiny_subic

from subic_keras.serving.export import export_litert, run_litert

# Integration tests: `-m "not slow"` skips them. The worker of test_export.py
# runs them (`xdist_group`): the model they export is trained once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("export")]


@pytest.fixture(scope="module")
def litert_paths(trained, cifar, tmp_path_factory):
    directory = tmp_path_factory.mktemp("litert")
    return {
        "float32": export_litert(trained, str(directory / "subic.tflite")),
        "int8": export_litert(
            trained,
            str(directory / "subic_int8.tflite"),
            "int8",
            representative_images=cifar[0][:100],
        ),
    }


def litert_ops(path: str) -> set[str]:
    from ai_edge_litert.interpreter import Interpreter

    return {op["op_name"] for op in Interpreter(model_path=path)._get_ops_details()}


def test_litert_float_matches_keras(
    litert_paths, cifar, keras_outputs, keras_class_query
):
    ops = litert_ops(litert_paths["float32"])
    assert not any("FLEX" in op or "CUSTOM" in op for op in ops), ops
    codes, z = keras_outputs
    out = run_litert(litert_paths["float32"], cifar[2], batch_size=24)
    assert out["codes"].dtype == np.int32 and out["query"].dtype == np.float32
    np.testing.assert_allclose(out["query"], z, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(
        out["class_query"], keras_class_query, rtol=1e-4, atol=1e-5
    )
    mismatched = out["codes"] != codes
    # A mismatch is allowed only where Keras's z nearly ties.
    blocks = z.reshape(len(z), M, K)
    rows, cols = np.nonzero(mismatched)
    gaps = (
        blocks[rows, cols, codes[rows, cols]]
        - blocks[rows, cols, out["codes"][rows, cols]]
    )
    assert np.all(gaps <= 1e-4), gaps
    assert mismatched.mean() <= 0.01
    # The same images as floats give the same outputs.
    floats = run_litert(litert_paths["float32"], cifar[2] / np.float32(255.0))
    np.testing.assert_array_equal(floats["codes"], out["codes"])


def test_run_litert_bad_batches(litert_paths, cifar):
    path = litert_paths["float32"]
    empty = run_litert(path, cifar[2][:0])
    assert empty["codes"].shape == (0, M) and empty["codes"].dtype == np.int32
    assert empty["query"].shape == (0, M * K)
    with pytest.raises(ValueError, match=r"shape \(n, 32, 32, 3\).*\(2, 16, 16, 3\)"):
        run_litert(path, cifar[2][:2, :16, :16])
    with pytest.raises(ValueError, match=r"shape \(n, 32, 32, 3\).*\(32, 32, 3\)"):
        run_litert(path, cifar[2][0])
    bad = cifar[2][:2] / np.float32(255.0)
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="images must be finite"):
        run_litert(path, bad)
    with pytest.raises(TypeError, match="uint8 or float, received dtype int64"):
        run_litert(path, cifar[2][:2].astype(np.int64))


def test_litert_int8(litert_paths, cifar, keras_outputs, keras_class_query):
    from ai_edge_litert.interpreter import Interpreter

    path = litert_paths["int8"]
    interpreter = Interpreter(model_path=path)
    signature = interpreter.get_signature_runner("serving_default")
    assert signature.get_input_details()["images"]["dtype"] == np.float32
    outputs = signature.get_output_details()
    assert outputs["codes"]["dtype"] == np.int32
    assert outputs["query"]["dtype"] == outputs["class_query"]["dtype"] == np.float32
    # Weights and activations of the dense and convolution layers are int8.
    ops = interpreter._get_ops_details()
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    heavy = [op for op in ops if op["op_name"] in ("FULLY_CONNECTED", "CONV_2D")]
    assert len(heavy) >= 4
    for op in heavy:
        assert tensors[op["inputs"][0]]["dtype"] == np.int8
        assert tensors[op["inputs"][1]]["dtype"] == np.int8
    assert not any("FLEX" in op["op_name"] or "CUSTOM" in op["op_name"] for op in ops)

    codes, z = keras_outputs
    out = run_litert(path, cifar[2])
    # The codes are the argmax of the dequantised z, ties to the lowest index,
    # and int8 makes ties common (zeros and equal levels).
    blocks = out["query"].reshape(-1, M, K)
    np.testing.assert_array_equal(out["codes"], reference_codes(out["query"], M))
    ties = (blocks == blocks.max(-1, keepdims=True)).sum(-1) > 1
    assert ties.any()
    agreement = (out["codes"] == codes).mean()
    assert agreement > 0.6, agreement
    assert np.corrcoef(out["query"].ravel(), z.ravel())[0, 1] > 0.95
    correlation = np.corrcoef(out["class_query"].ravel(), keras_class_query.ravel())
    assert correlation[0, 1] > 0.95, correlation


def test_int8_codes_survive_large_z(tmp_path):
    # z in the hundreds gives an int8 scale > 1, where LiteRT's quantised
    # EQUAL (and so a max-and-compare argmax) returns wrong answers.
    keras.utils.set_random_seed(3)
    subic = tiny_subic()
    fc0 = subic.train_model.get_layer("fc0")
    fc0.kernel.assign(fc0.kernel.numpy() * 300.0)
    images = np.random.default_rng(4).integers(0, 256, (64, 8, 8, 3), np.uint8)
    path = export_litert(subic, str(tmp_path / "q.tflite"), "int8", images)
    out = run_litert(path, images)
    assert out["query"].max() > 300
    np.testing.assert_array_equal(out["codes"], reference_codes(out["query"], 2))
    assert (out["codes"] == subic.encode(images / 255.0)).mean() > 0.8
