"""TensorFlow zoo: keras.applications ResNet50 and MobileNetV2 (weights=None) and a Keras BERT-style
encoder, random weights from fixed seeds, NHWC image inputs. See aiacc.zoo for sizes. The test-size
catalogue (aiacc.zoo.small.tf_models) builds its small ResNet50 and MobileNetV2 with these builders."""
from __future__ import annotations

import os

import numpy as np

from aiacc.errors import UnsupportedError

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _keras():
    import keras

    return keras


def randomize_batchnorm(model, seed: int) -> None:
    """Random gamma, beta, moving mean and (positive) variance in every BatchNormalization layer (each must
    have gamma and beta)."""
    keras = _keras()
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            if not (layer.scale and layer.center):
                raise UnsupportedError(f"{layer.name}: randomize_batchnorm expects a BatchNormalization with "
                                       f"gamma and beta (scale=True, center=True)")
            gamma, beta, mean, var = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape).astype(gamma.dtype),
                               (0.1 * rng.standard_normal(beta.shape)).astype(beta.dtype),
                               (0.1 * rng.standard_normal(mean.shape)).astype(mean.dtype),
                               rng.uniform(0.5, 1.5, var.shape).astype(var.dtype)])


def _images(batch: int, size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((batch, size, size, 3), dtype=np.float32)


def resnet50(batch: int = 1, size: int = 224, num_classes: int = 1000):
    """keras.applications.ResNet50 (logits out) and a (batch, size, size, 3) image batch."""
    keras = _keras()
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=num_classes,
                                        classifier_activation=None)
    randomize_batchnorm(model, 1)
    return model, _images(batch, size, 10)


def mobilenet_v2(batch: int = 1, size: int = 224, num_classes: int = 1000, alpha: float = 1.0):
    """keras.applications.MobileNetV2 (logits out) and a (batch, size, size, 3) image batch."""
    keras = _keras()
    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(weights=None, input_shape=(size, size, 3), classes=num_classes,
                                           alpha=alpha, classifier_activation=None)
    randomize_batchnorm(model, 2)
    return model, _images(batch, size, 11)


def bert_encoder(batch: int = 1, seq: int = 128, vocab: int = 8192, hidden: int = 256, heads: int = 4,
                 layers: int = 4, ffn: int = 1024):
    """A Keras BERT-style encoder: token + position embeddings, LayerNorm, `layers` x (MultiHeadAttention,
    Add+LayerNorm, Dense-gelu-Dense, Add+LayerNorm), and a tanh pooler on the first token; outputs
    (last hidden state, pooled). Inputs: (batch, seq) int32 token ids."""
    keras = _keras()
    keras.utils.set_random_seed(0)
    L = keras.layers
    tokens = keras.Input((seq,), dtype="int32", name="input_ids")
    x = L.Embedding(vocab, hidden, name="tok_embed")(tokens)
    pos = L.Embedding(seq, hidden, name="pos_embed")(keras.ops.arange(seq))
    x = L.LayerNormalization(epsilon=1e-12, name="embed_ln")(x + pos)
    for i in range(layers):
        a = L.MultiHeadAttention(heads, hidden // heads, dropout=0.1, name=f"mha{i}")(x, x)
        x = L.LayerNormalization(epsilon=1e-12, name=f"ln{i}a")(x + L.Dropout(0.1)(a))
        f = L.Dense(ffn, activation="gelu", name=f"ffn{i}a")(x)
        f = L.Dense(hidden, name=f"ffn{i}b")(f)
        x = L.LayerNormalization(epsilon=1e-12, name=f"ln{i}b")(x + L.Dropout(0.1)(f))
    pooled = L.Dense(hidden, activation="tanh", name="pooler")(x[:, 0])
    model = keras.Model(tokens, [x, pooled], name="bert_encoder")
    ids = np.random.default_rng(5).integers(0, vocab, (batch, seq)).astype(np.int32)
    return model, ids
