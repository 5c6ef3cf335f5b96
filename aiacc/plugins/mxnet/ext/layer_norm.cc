// aiacc_layer_norm: LayerNorm over the last axis as an MXNet extension operator (lib_api.h, CPU, float32).
//
// Why: MXNet 1.9's own _backward_LayerNorm on CPU runs its reductions through generic broadcast kernels,
// ~1.8-3.4 ms for a [512, 256] input, 25-30 ms of a 4-layer encoder's ~150 ms training step; this kernel
// does the same arithmetic in one pass per row (~0.1 ms). aiacc/plugins/mxnet/extension.py compiles and
// loads it; the MXNet exporter emits it in training graphs.
//
// Outputs: y, mean, rstd (1 / sqrt(var + eps)), as MXNet's LayerNorm returns y, mean, std.
// Backward (MXNet passes output grads, then inputs, then outputs): inputs dy, dmean, drstd, x, gamma, beta,
// y, mean, rstd; outputs dx, dgamma, dbeta. lib_api does not pass the write/add request, so the exporter
// feeds variables (whose gradients may be accumulated, grad_req='add') through an identity op: this
// operator's gradients always land in buffers MXNet then writes or adds.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "lib_api.h"

using namespace mxnet::ext;  // NOLINT: lib_api's macros and enums are written for it

namespace {

using Attrs = std::unordered_map<std::string, std::string>;

// rows below this many elements run on one thread: the fork/join costs more than the work. The row
// reductions are `omp simd` (vectorized, so summed in another order than a serial loop: ~1e-7 relative)
constexpr int64_t kParallelElements = 1 << 15;

int Threads(int64_t elements) {
  return elements < kParallelElements ? 1 : omp_get_max_threads();
}

MXReturnValue ParseAttrs(const Attrs& attrs, int* num_in, int* num_out) {
  *num_in = 3;
  *num_out = 3;
  if (attrs.count("eps") == 0) {
    MX_ERROR_MSG << "aiacc_layer_norm needs an eps attribute";
    return MX_FAIL;
  }
  return MX_SUCCESS;
}

MXReturnValue InferType(const Attrs& attrs, std::vector<int>* in, std::vector<int>* out) {
  for (size_t i = 0; i < in->size(); ++i) {
    if ((*in)[i] != kFloat32) {
      MX_ERROR_MSG << "aiacc_layer_norm takes float32 inputs only; input " << i << " has MXNet dtype code "
                   << (*in)[i];
      return MX_FAIL;
    }
  }
  for (size_t i = 0; i < out->size(); ++i) (*out)[i] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue InferShape(const Attrs& attrs, std::vector<std::vector<unsigned int>>* in,
                         std::vector<std::vector<unsigned int>>* out) {
  const std::vector<unsigned int>& x = (*in)[0];
  const std::vector<unsigned int>& g = (*in)[1];
  const std::vector<unsigned int>& b = (*in)[2];
  if (x.empty() || g.size() != 1 || b.size() != 1 || g[0] != x.back() || b[0] != x.back()) {
    MX_ERROR_MSG << "aiacc_layer_norm: gamma and beta must be 1-d of the data's last dimension";
    return MX_FAIL;
  }
  std::vector<unsigned int> rows(x.begin(), x.end() - 1);
  if (rows.empty()) rows.push_back(1);
  (*out)[0] = x;
  (*out)[1] = rows;
  (*out)[2] = rows;
  return MX_SUCCESS;
}

MXReturnValue Forward(const Attrs& attrs, std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                      const OpResource& res) {
  const float eps = std::strtof(attrs.at("eps").c_str(), nullptr);
  MXTensor& xt = (*inputs)[0];
  const int64_t c = xt.shape.back();
  const int64_t n = c == 0 ? 0 : xt.size() / c;
  const float* x = xt.data<float>();
  const float* g = (*inputs)[1].data<float>();
  const float* b = (*inputs)[2].data<float>();
  float* y = (*outputs)[0].data<float>();
  float* mean = (*outputs)[1].data<float>();
  float* rstd = (*outputs)[2].data<float>();
#pragma omp parallel for num_threads(Threads(n * c)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* row = x + i * c;
    float m = 0.f;
#pragma omp simd reduction(+ : m)
    for (int64_t j = 0; j < c; ++j) m += row[j];
    m /= static_cast<float>(c);
    float v = 0.f;
#pragma omp simd reduction(+ : v)
    for (int64_t j = 0; j < c; ++j) {
      const float d = row[j] - m;
      v += d * d;
    }
    const float r = 1.f / std::sqrt(v / static_cast<float>(c) + eps);
    mean[i] = m;
    rstd[i] = r;
    float* out = y + i * c;
    for (int64_t j = 0; j < c; ++j) out[j] = (row[j] - m) * r * g[j] + b[j];
  }
  return MX_SUCCESS;
}

MXReturnValue Backward(const Attrs& attrs, std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                       const OpResource& res) {
  const float* dy = (*inputs)[0].data<float>();
  MXTensor& xt = (*inputs)[3];
  const int64_t c = xt.shape.back();
  const int64_t n = c == 0 ? 0 : xt.size() / c;
  const float* x = xt.data<float>();
  const float* g = (*inputs)[4].data<float>();
  const float* mean = (*inputs)[7].data<float>();
  const float* rstd = (*inputs)[8].data<float>();
  float* dx = (*outputs)[0].data<float>();
  float* dg = (*outputs)[1].data<float>();
  float* db = (*outputs)[2].data<float>();
  const int threads = Threads(n * c);
  // per-thread partial sums of dgamma / dbeta, added in thread order (deterministic for a thread count)
  std::vector<float> partial(static_cast<size_t>(threads) * 2 * c, 0.f);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    float* pg = partial.data() + static_cast<size_t>(t) * 2 * c;
    float* pb = pg + c;
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t end = std::min<int64_t>(n, (t + 1) * chunk);
    for (int64_t i = t * chunk; i < end; ++i) {
      const float* xr = x + i * c;
      const float* dr = dy + i * c;
      const float m = mean[i];
      const float r = rstd[i];
      float s1 = 0.f;
      float s2 = 0.f;
#pragma omp simd reduction(+ : s1, s2)
      for (int64_t j = 0; j < c; ++j) {
        const float xh = (xr[j] - m) * r;
        const float gy = dr[j] * g[j];
        s1 += gy;
        s2 += gy * xh;
        pg[j] += dr[j] * xh;
        pb[j] += dr[j];
      }
      s1 /= static_cast<float>(c);
      s2 /= static_cast<float>(c);
      float* out = dx + i * c;
      for (int64_t j = 0; j < c; ++j) {
        const float xh = (xr[j] - m) * r;
        out[j] = r * (dr[j] * g[j] - s1 - xh * s2);
      }
    }
  }
  for (int64_t j = 0; j < c; ++j) {
    float sg = 0.f;
    float sb = 0.f;
    for (int t = 0; t < threads; ++t) {
      sg += partial[static_cast<size_t>(t) * 2 * c + j];
      sb += partial[static_cast<size_t>(t) * 2 * c + c + j];
    }
    dg[j] = sg;
    db[j] = sb;
  }
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(aiacc_layer_norm)
.setParseAttrs(ParseAttrs)
.setInferType(InferType)
.setInferShape(InferShape)
.setForward(Forward, "cpu")
.setBackward(Backward, "cpu");

MXReturnValue initialize(int version) {
  if (version < 10900) {
    MX_ERROR_MSG << "aiacc_layer_norm is built for MXNet 1.9 or later, not " << version;
    return MX_FAIL;
  }
  return MX_SUCCESS;
}
