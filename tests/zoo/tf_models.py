"""The TensorFlow test zoo: the catalogue's test-size models (aiacc.zoo.small.tf_models, re-exported) and the
forms only the tests need: a tf.Module with a signature (no Keras) and a tf.function with an op aiacc keeps
opaque. `TF_ZOO` maps a name to its builder; builders return (model, example_inputs) and are cached.
"""
from __future__ import annotations

import functools

import numpy as np

from aiacc.zoo.small import tf_models as small
from aiacc.zoo.small.tf_models import (bert_encoder, mlp, mobilenet_v2, randomize_batchnorm, resnet50,  # noqa: F401
                                       small_cnn)


def _tf():
    import tensorflow as tf

    return tf


@functools.lru_cache(maxsize=None)
def mlp_module():
    """A tf.Module whose __call__ is a tf.function with an input signature (no Keras)."""
    tf = _tf()
    rng = np.random.default_rng(6)

    class MLPModule(tf.Module):
        def __init__(self):
            super().__init__(name="mlp_module")
            self.w1 = tf.Variable(rng.standard_normal((8, 16)).astype(np.float32))
            self.b1 = tf.Variable(rng.standard_normal(16).astype(np.float32))
            self.w2 = tf.Variable(rng.standard_normal((16, 4)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
        def __call__(self, x):
            h = tf.nn.relu(tf.matmul(x, self.w1) + self.b1)
            return tf.nn.softmax(tf.matmul(h, self.w2))

    return MLPModule(), rng.standard_normal((5, 8)).astype(np.float32)


@functools.lru_cache(maxsize=None)
def opaque_function():
    """A tf.function using Cumsum, which aiacc does not translate: it stays an opaque node."""
    tf = _tf()
    rng = np.random.default_rng(7)
    w = tf.constant(rng.standard_normal((6, 6)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32)])
    def with_cumsum(x):
        h = tf.nn.relu(tf.matmul(x, w))
        return tf.math.cumsum(h, axis=1) * 0.5 + tf.tanh(h)

    return with_cumsum, rng.standard_normal((4, 6)).astype(np.float32)


TF_ZOO = {**small.TF_ZOO, "mlp_module": mlp_module, "opaque_function": opaque_function}
