"""Keras models converted to LiteRT and run there, for the tests."""

import tensorflow as tf


def tflite_bytes(model):
    """Converts with builtin ops only; fails if any op would need Select TF."""
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter.convert()


def run_tflite(content, x):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    index = interpreter.get_input_details()[0]["index"]
    interpreter.resize_tensor_input(index, x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(index, x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
