"""TensorFlow's own stateless Philox draws written in TF integer ops, so XLA reproduces them bit for bit.

Under `jit_compile=True` XLA lowers `StatelessRandomGetKeyCounter` and `StatelessRandomUniformV2` itself and
draws other numbers than TensorFlow's CPU/GPU kernels from the same seed (TF 2.21: the uniform's bits are
another counter layout; the key of a negative seed component is another extension to 64 bits), so a
training step compiled by XLA would drop other elements than the original's Keras dropout. The functions
here compute what TensorFlow's kernels compute (Philox-4x32-10, `random::PhiloxRandom`; the seed scrambled
as `GenerateKey` in stateless_random_ops.cc; a float32 uniform from the low 23 bits, `Uint32ToFloat`) with
32-bit multiplies (taken in uint64), shifts and xors, which XLA compiles exactly. They are slow: in a BERT-style encoder's
training step under XLA (batch 8, 12 dropouts of 131k elements) they cost ~80 ms against TensorFlow's kernels'
~3 ms (XLA's CPU loops recompute the block per output word and do not vectorize the 64-bit products; an
optimization barrier did not change it), and outside XLA they are hundreds of small ops: the training
exporter uses them only in a step that XLA compiles (aiacc/plugins/tf/training.py, `xla_random`), where
they make the step right, and the measured step choice keeps the faster step without XLA.
"""
from __future__ import annotations

from typing import Any

from aiacc.plugins.tf._tf import tf

# Philox-4x32 multipliers and Weyl key increments (random::PhiloxRandom)
M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
# GenerateKey's fixed key for scrambling a seed into (key, counter)
SEED_KEY = (0x3EC8F720, 0x02461E29)
# StatelessRandomUniformV2's alg values TF's kernels draw with Philox: RNG_ALG_PHILOX, RNG_ALG_AUTO_SELECT
PHILOX_ALGS = (1, 3)


def philox_block(x: list, k0: Any, k1: Any) -> list:
    """Philox-4x32-10 of the counter words `x` (four uint32 tensors, broadcasting together) under the key
    words `k0`, `k1` (uint32): the four uint32 results in TensorFlow's order. Each 32x32-bit product is
    taken in uint64 (exact: both factors are below 2**32), everything else in uint32."""
    tfm = tf()
    u32, u64 = tfm.uint32, tfm.uint64
    sh = tfm.constant(32, u64)
    m0, m1 = tfm.constant(M0, u64), tfm.constant(M1, u64)
    x0, x1, x2, x3 = x
    for r in range(ROUNDS):
        p0, p1 = tfm.cast(x0, u64) * m0, tfm.cast(x2, u64) * m1
        hi0, hi1 = tfm.cast(tfm.bitwise.right_shift(p0, sh), u32), tfm.cast(tfm.bitwise.right_shift(p1, sh), u32)
        x0, x1, x2, x3 = hi1 ^ x1 ^ k0, tfm.cast(p1, u32), hi0 ^ x3 ^ k1, tfm.cast(p0, u32)
        if r < ROUNDS - 1:
            k0, k1 = k0 + tfm.constant(W0, u32), k1 + tfm.constant(W1, u32)
    return [x0, x1, x2, x3]


def _words(v: Any) -> tuple:
    """(low, high) 32-bit words of a uint64 tensor, as uint32."""
    tfm = tf()
    return tfm.cast(v, tfm.uint32), tfm.cast(tfm.bitwise.right_shift(v, tfm.constant(32, tfm.uint64)), tfm.uint32)


def key_counter(seed: Any) -> tuple:
    """(key uint64[1], counter uint64[2]) as StatelessRandomGetKeyCounter gives them for a shape-[2] int32
    or int64 seed on TensorFlow's kernels (each seed component sign-extended to 64 bits, scrambled by one
    Philox block under SEED_KEY)."""
    tfm = tf()
    u32, u64 = tfm.uint32, tfm.uint64
    s = tfm.bitcast(tfm.cast(seed, tfm.int64), u64)  # int32 -> int64 sign-extends, as C++'s int32 -> uint64
    lo0, hi0 = _words(s[0])
    lo1, hi1 = _words(s[1])
    mix = [tfm.cast(w, u64) for w in philox_block([lo0, hi0, lo1, hi1], tfm.constant(SEED_KEY[0], u32),
                                                   tfm.constant(SEED_KEY[1], u32))]
    sh = tfm.constant(32, u64)
    key = mix[0] | tfm.bitwise.left_shift(mix[1], sh)
    counter_hi = mix[2] | tfm.bitwise.left_shift(mix[3], sh)
    return tfm.reshape(key, [1]), tfm.stack([tfm.constant(0, u64), counter_hi])


def uniform_float32(shape: Any, key: Any, counter: Any) -> Any:
    """StatelessRandomUniformV2's float32 result in [0, 1) for `shape` (int32/int64 vector) from Philox
    `key` (uint64[1]) and `counter` (uint64[2]): element i is Uint32ToFloat of word i % 4 of the block at
    counter + i // 4 (a 128-bit increment)."""
    tfm = tf()
    u32, u64 = tfm.uint32, tfm.uint64
    n = tfm.reduce_prod(tfm.cast(shape, tfm.int64))
    i = tfm.cast(tfm.range((n + 3) // 4, dtype=tfm.int64), u64)
    c0 = counter[0] + i
    c1 = counter[1] + tfm.cast(c0 < counter[0], u64)  # the carry into the counter's high 64 bits
    lo0, hi0 = _words(c0)
    lo1, hi1 = _words(c1)
    k0, k1 = _words(key[0])
    words = philox_block([lo0, hi0, lo1, hi1], k0, k1)
    bits = tfm.reshape(tfm.transpose(tfm.stack(words, axis=0)), [-1])[:n]
    one_to_two = tfm.bitcast((bits & tfm.constant(0x7FFFFF, u32)) | tfm.constant(0x3F800000, u32), tfm.float32)
    return tfm.reshape(one_to_two - 1.0, tfm.cast(shape, tfm.int64))
