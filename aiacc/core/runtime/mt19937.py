"""numba Mersenne Twister (MT19937) that continues a given generator state: the 32-bit stream, and a
dropout noise drawn from it as a 53-bit uniform per element.

A framework's CPU generator that is an MT19937 (torch's default generator) draws a dropout mask one element at a
time through its generator object; the same stream comes out several times faster when the 624-word state is
twisted and tempered in blocks. The caller hands over the state (624 words, the next index and the count of
words left, as torch's engine keeps them: `left + next == 625`, a twist when `left` reaches 1) and writes
back what `words` returns, so the generator continues exactly as if it had drawn the words itself.

    words(state, nxt, left, out_uint32)          -> (nxt, left)     # the next out.size words
    keep_noise(words, thr, scale, out)                               # out[k] = scale if u53(k) < thr else 0

`u53(k)` is `((words[2k] & (2**21 - 1)) << 32) | words[2k + 1]`: the low 53 bits of the 64-bit number made
from two consecutive words, the first the high half (torch's random64 and its double uniform). Compiled
with numba's cache=True. Without numba, importing this module raises ImportError.
"""
from __future__ import annotations

import numba
import numpy as np

_JIT = dict(fastmath=False, error_model="numpy", cache=True, nogil=True, boundscheck=False)
_U = np.uint32
N, M = 624, 397


@numba.njit(**_JIT)
def _twist(st):  # pragma: no cover - compiled
    """MT19937's state transition in place (the reference algorithm, branch-free)."""
    upper, lower, matrix = _U(0x80000000), _U(0x7FFFFFFF), _U(0x9908B0DF)
    for i in range(N - M):
        y = (st[i] & upper) | (st[i + 1] & lower)
        st[i] = st[i + M] ^ (y >> _U(1)) ^ ((_U(0) - (st[i + 1] & _U(1))) & matrix)
    for i in range(N - M, N - 1):
        y = (st[i] & upper) | (st[i + 1] & lower)
        st[i] = st[i + M - N] ^ (y >> _U(1)) ^ ((_U(0) - (st[i + 1] & _U(1))) & matrix)
    y = (st[N - 1] & upper) | (st[0] & lower)
    st[N - 1] = st[M - 1] ^ (y >> _U(1)) ^ ((_U(0) - (st[0] & _U(1))) & matrix)


@numba.njit(**_JIT)
def words(st, nxt, left, out):  # pragma: no cover - compiled
    """Fill `out` (uint32) with the generator's next out.size tempered words, advancing `st` (uint32[624])
    in place; returns the new (nxt, left)."""
    n = out.size
    k = 0
    while k < n:
        if left <= 1:
            _twist(st)
            left = N + 1
            nxt = 0
        m = min(left - 1, n - k)
        for j in range(m):  # tempering: independent per word, vectorized by LLVM
            y = st[nxt + j]
            y ^= y >> _U(11)
            y ^= (y << _U(7)) & _U(0x9D2C5680)
            y ^= (y << _U(15)) & _U(0xEFC60000)
            y ^= y >> _U(18)
            out[k + j] = y
        k += m
        nxt += m
        left -= m
    return nxt, left


@numba.njit(**_JIT)
def keep_noise(w, thr, scale, out):  # pragma: no cover - compiled
    """out[k] = scale where the k-th 53-bit uniform of `w` (two words per element) is below `thr`, else 0."""
    low21 = np.uint64((1 << 21) - 1)
    for k in range(out.size):
        u = ((np.uint64(w[2 * k]) & low21) << np.uint64(32)) | np.uint64(w[2 * k + 1])
        out[k] = scale if u < thr else 0
