"""TensorFlow models at test size, built in code with fixed seeds (no downloads): ResNet50, MobileNetV2 (the
bundled builders, small), a BERT-style encoder, an MLP and a small layout-sensitive CNN. The test zoo
(tests/zoo/tf_models.py) adds a tf.Module and a tf.function with an op aiacc keeps opaque.

Every builder returns (model, example_inputs). Input sizes are small (64x64 images, 16-token sequences)
so that a forward pass takes milliseconds on 2 cores. Batch-norm statistics are randomized so that a
translation that mixes up scale, offset, mean or variance shows in the outputs. Builders are cached:
tests in one process share one ResNet50.
"""
from __future__ import annotations

import functools
import os

import numpy as np

from aiacc.zoo import tf_models as bundled
from aiacc.zoo.tf_models import randomize_batchnorm  # random BatchNorm statistics, as the bundled models

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _keras():
    import keras

    return keras


def _image(batch=2, size=64, channels=3, seed=0):
    return np.random.default_rng(seed).random((batch, size, size, channels), dtype=np.float32)


@functools.lru_cache(maxsize=None)
def resnet50():
    """keras.applications.ResNet50 (the bundled builder), random weights, 64x64 input, logits out."""
    return bundled.resnet50(size=64)[0], _image()


@functools.lru_cache(maxsize=None)
def mobilenet_v2():
    """keras.applications.MobileNetV2 (depthwise convs, Relu6, ZeroPadding; the bundled builder), random
    weights, width 0.5, 64x64."""
    return bundled.mobilenet_v2(size=64, alpha=0.5)[0], _image(seed=1)


@functools.lru_cache(maxsize=None)
def bert_encoder(layers: int = 2, vocab: int = 100, seq: int = 16, dim: int = 32, heads: int = 4):
    """A BERT-style encoder: token + position embeddings, `layers` x (MultiHeadAttention, Add+LayerNorm,
    Dense-gelu-Dense feed-forward, Add+LayerNorm), dropout (identity at inference)."""
    keras = _keras()
    keras.utils.set_random_seed(0)
    tokens = keras.Input((seq,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(vocab, dim, name="tok_embed")(tokens)
    pos = keras.layers.Embedding(seq, dim, name="pos_embed")(keras.ops.arange(seq))
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="embed_ln")(x + pos)
    for i in range(layers):
        a = keras.layers.MultiHeadAttention(heads, dim // heads, dropout=0.1, name=f"mha{i}")(x, x)
        a = keras.layers.Dropout(0.1)(a)
        x = keras.layers.LayerNormalization(epsilon=1e-6, name=f"ln{i}a")(x + a)
        f = keras.layers.Dense(4 * dim, activation="gelu", name=f"ffn{i}a")(x)
        f = keras.layers.Dense(dim, name=f"ffn{i}b")(f)
        x = keras.layers.LayerNormalization(epsilon=1e-6, name=f"ln{i}b")(x + keras.layers.Dropout(0.1)(f))
    model = keras.Model(tokens, x, name="bert_encoder")
    ids = np.random.default_rng(3).integers(0, vocab, (2, seq)).astype(np.int32)
    return model, ids


@functools.lru_cache(maxsize=None)
def mlp():
    """A Keras MLP: Dense-relu, Dropout, Dense-tanh, Dense-softmax."""
    keras = _keras()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dropout(0.5), keras.layers.Dense(32, activation="tanh"),
                              keras.layers.Dense(10, activation="softmax")], name="mlp")
    return model, np.random.default_rng(4).standard_normal((3, 20)).astype(np.float32)


@functools.lru_cache(maxsize=None)
def small_cnn():
    """A small functional CNN covering layout-sensitive layers the applications do not: SAME and strided
    convs, separable conv, AveragePooling2D / MaxPooling2D with SAME padding, Concatenate on channels,
    elu / selu / sigmoid / leaky relu, Flatten and a Dense head."""
    keras = _keras()
    keras.utils.set_random_seed(0)
    L = keras.layers
    inp = keras.Input((24, 24, 3), name="image")
    a = L.Conv2D(8, 3, padding="same", activation="elu")(inp)
    b = L.Conv2D(8, 5, strides=2, padding="same")(inp)
    b = L.ZeroPadding2D(((0, 12), (12, 0)))(b)
    x = L.Concatenate()([a, b])
    x = L.BatchNormalization()(x)
    x = L.LeakyReLU(0.2)(x)
    x = L.AveragePooling2D(3, strides=2, padding="same")(x)
    x = L.SeparableConv2D(12, 3, padding="same", activation="selu")(x)
    x = L.MaxPooling2D(2, padding="same")(x)
    x = L.Conv2D(6, 1, activation="sigmoid")(x)
    x = L.Flatten()(x)
    x = L.Dense(5)(x)
    model = keras.Model(inp, x, name="small_cnn")
    randomize_batchnorm(model, 5)
    return model, np.random.default_rng(5).standard_normal((2, 24, 24, 3)).astype(np.float32)


TF_ZOO = {"resnet50": resnet50, "mobilenet_v2": mobilenet_v2, "bert_encoder": bert_encoder, "mlp": mlp,
          "small_cnn": small_cnn}
