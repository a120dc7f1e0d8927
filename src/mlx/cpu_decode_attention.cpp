// See cpu_decode_attention.h.
#include "cpu_decode_attention.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "ablation.h"
#include "cpu_fast_ops.h"
#include "cpu_strided.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlex {
namespace {

// The inputs, in this order: qkv, the key buffer, the value buffer, then (each where given) q_norm
// and k_norm's weights, freqs, positions, key_start.
class CpuDecodeAttention : public mx::Primitive {
  struct Params {
    int hq, hkv, offset;
    float scale;
    bool norms;
    float eps;
    int dims;
    bool traditional;
    float base, rope_scale;
    bool freqs, positions, key_start;
    bool operator==(const Params&) const = default;
  };

 public:
  CpuDecodeAttention(mx::Stream s, const DecodeAttentionArgs& a)
      : mx::Primitive(s),
        p_{a.n_q_heads, a.n_kv_heads, a.offset, a.scale, a.q_norm.has_value(), a.norm_eps, a.rope_dims,
           a.traditional, a.base, a.rope_scale, a.freqs.has_value(), a.positions.has_value(),
           a.key_start.has_value()} {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    // MLX gives each output of a multi-output op its own copy of the inputs' handles, so while
    // the other outputs hold theirs no input is ever donatable. They are dropped here, as MLX
    // drops them right after this evaluation (array::detach); the output being evaluated keeps
    // its list (`inputs`). Not while tracing (mx::compile), which keeps graphs whole.
    if (!outputs[0].is_tracer()) {
      for (auto& out : outputs) {
        if (&out.inputs() != &inputs) out.inputs().clear();
      }
    }
    // Whether each buffer can be written in place is decided before anything here takes another
    // reference to it.
    const bool k_in_place = reuse(inputs[1], outputs[1]);
    const bool v_in_place = reuse(inputs[2], outputs[2]);
    outputs[0].set_data(mx::allocator::malloc(outputs[0].nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) enc.set_input_array(in);
    for (auto& out : outputs) enc.set_output_array(out);
    float* o = outputs[0].data<float>();
    float* ko = outputs[1].data<float>();
    float* vo = outputs[2].data<float>();
    const size_t n = outputs[0].size();
    enc.dispatch([=, p = p_, inputs = inputs]() {
      try {
        if (!k_in_place) copy_rows(inputs[1], ko);
        if (!v_in_place) copy_rows(inputs[2], vo);
        run(p, inputs, o, ko, vo);
      } catch (...) {
        // Only allocation can fail here; MLX's CPU thread must not see an exception.
        std::fill(o, o + n, std::numeric_limits<float>::quiet_NaN());
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("[CpuDecodeAttention] runs on the CPU only");
  }
  const char* name() const override { return "CpuDecodeAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const CpuDecodeAttention*>(&other);
    return o && o->p_ == p_;
  }

 private:
  // `out` takes `in`'s buffer where MLX allows it (this op holds the only reference and the
  // buffer is row contiguous), else a buffer of its own that the task fills first.
  static bool reuse(const mx::array& in, mx::array& out) {
    if (in.is_donatable() && in.flags().row_contiguous && in.itemsize() == out.itemsize()) {
      out.copy_shared_buffer(in);
      return true;
    }
    out.set_data(mx::allocator::malloc(out.nbytes()));
    return false;
  }

  // `a` (any strides: a broadcast of zeros, a view) into contiguous `dst`.
  static void copy_rows(const mx::array& a, float* dst) {
    const int64_t rows = row_count(a), d = a.shape(-1), s = a.strides().back();
    const float* src = a.data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = src + row_offset(a, r);
      for (int64_t i = 0; i < d; ++i) dst[r * d + i] = x[i * s];
    }
  }

  static void run(const Params& p, const std::vector<mx::array>& inputs, float* o, float* ko, float* vo) {
    const mx::array& qkv = inputs[0];
    const int64_t B = inputs[1].shape(0), C = inputs[1].shape(2), D = inputs[1].shape(3);
    const int64_t hq = p.hq, hkv = p.hkv, rep = hq / hkv, at = p.offset, xs = qkv.strides().back();
    const float* wq = p.norms ? inputs[3].data<float>() : nullptr;
    const float* wk = p.norms ? inputs[4].data<float>() : nullptr;
    const int64_t wqs = p.norms ? inputs[3].strides()[0] : 0, wks = p.norms ? inputs[4].strides()[0] : 0;
    // Where the optional inputs sit.
    const size_t at_freqs = 3 + (p.norms ? 2 : 0), at_positions = at_freqs + (p.freqs ? 1 : 0),
                 at_start = at_positions + (p.positions ? 1 : 0);
    auto int_at = [&](size_t input, int64_t b) {
      const mx::array& a = inputs[input];
      return static_cast<int64_t>(a.data<int32_t>()[b * a.strides()[0]]);
    };
    // Each row's rotation angles (one table where the rows share the position).
    const int half = p.dims / 2;
    const int64_t tables = p.positions ? B : 1;
    std::vector<float> inv(half), c(tables * half), s(tables * half);
    if (p.dims > 0) {
      const mx::array* f = p.freqs ? &inputs[at_freqs] : nullptr;
      rope_inv_freqs(half, p.base, f ? f->data<float>() : nullptr, f ? f->strides()[0] : 0, inv.data());
      for (int64_t t = 0; t < tables; ++t) {
        rope_angles(0.f, p.positions ? int_at(at_positions, t) : at, p.rope_scale, inv.data(), half, c.data() + t * half,
                    s.data() + t * half);
      }
    }
    // A head of row b (D features of qkv, `xs` apart) normalized and rotated as the separate ops
    // do it: the norm's output, then the rotation of that.
    auto head = [&](int64_t b, const float* x, const float* w, int64_t ws, float* out) {
      std::vector<float> normed;
      int64_t stride = xs;
      if (w) {
        normed.resize(D);
        rms_norm_row(x, xs, D, w, ws, p.eps, normed.data());
        x = normed.data();
        stride = 1;
      }
      if (p.dims > 0) {
        const int64_t t = p.positions ? b : 0;
        rope_row(x, stride, D, p.dims, p.traditional, c.data() + t * half, s.data() + t * half, out);
      } else {
        for (int64_t i = 0; i < D; ++i) out[i] = x[i * stride];
      }
    };
    const float* base = qkv.data<float>();
    for (int64_t b = 0; b < B; ++b) {
      const float* row = base + row_offset(qkv, b);
      for (int64_t h = 0; h < hkv; ++h) {
        const int64_t cell = ((b * hkv + h) * C + at) * D;
        head(b, row + (hq + h) * D * xs, wk, wks, ko + cell);
        const float* v = row + (hq + hkv + h) * D * xs;
        for (int64_t i = 0; i < D; ++i) vo[cell + i] = v[i * xs];
      }
    }
    const float scale = p.scale;
    attend_rows(B * hq, (at + 1) * D, [&](int64_t r) {
      const int64_t b = r / hq, h = r % hq, g = h / rep;
      std::vector<float> q(D);
      head(b, base + row_offset(qkv, b) + h * D * xs, wq, wqs, q.data());
      for (int64_t i = 0; i < D; ++i) q[i] = scale * q[i];
      const int64_t first = p.key_start ? std::clamp<int64_t>(int_at(at_start, b), 0, at) : 0;
      const int64_t cell = ((b * hkv + g) * C + first) * D;
      attend_row(q.data(), ko + cell, D, 1, vo + cell, D, 1, at + 1 - first, D, o + r * D);
    });
  }

  Params p_;
};

bool f32_vector(const std::optional<mx::array>& a, int64_t n) {
  return !a || (a->dtype() == mx::float32 && a->ndim() == 1 && a->shape(0) == n);
}

bool per_row(const std::optional<mx::array>& a, int64_t rows) { return !a || (a->ndim() == 1 && a->shape(0) == rows); }

}  // namespace

std::optional<std::tuple<mx::array, mx::array, mx::array>> cpu_decode_attention(const mx::array& qkv,
                                                                                 const mx::array& k_cache,
                                                                                 const mx::array& v_cache,
                                                                                 const DecodeAttentionArgs& a) {
  const auto s = mx::to_stream({});
  if (ablated(MLEX_ABLATE_KERNEL_CPU_DECODE_ATTN) || ablated(MLEX_ABLATE_KERNEL_CPU_FAST_OPS) ||
      s.device != mx::Device::cpu || qkv.ndim() != 3 || k_cache.ndim() != 4 || v_cache.shape() != k_cache.shape() ||
      qkv.dtype() != mx::float32 || k_cache.dtype() != mx::float32 || v_cache.dtype() != mx::float32) {
    return std::nullopt;
  }
  const int64_t B = k_cache.shape(0), hkv = k_cache.shape(1), C = k_cache.shape(2), D = k_cache.shape(3);
  if (a.n_kv_heads != hkv || hkv == 0 || a.n_q_heads % hkv != 0 || qkv.shape(0) != B || qkv.shape(1) != 1 ||
      qkv.shape(2) != (a.n_q_heads + 2 * hkv) * D || a.offset < 0 || a.offset >= C ||
      a.q_norm.has_value() != a.k_norm.has_value() || !f32_vector(a.q_norm, D) || !f32_vector(a.k_norm, D) ||
      a.rope_dims < 0 || a.rope_dims % 2 != 0 || a.rope_dims > D ||
      (a.freqs && (a.freqs->ndim() != 1 || a.freqs->shape(0) != a.rope_dims / 2)) || !per_row(a.positions, B) ||
      !per_row(a.key_start, B)) {
    return std::nullopt;
  }
  std::vector<mx::array> inputs{qkv, k_cache, v_cache};
  if (a.q_norm) {
    inputs.push_back(*a.q_norm);
    inputs.push_back(*a.k_norm);
  }
  if (a.freqs) inputs.push_back(mx::astype(*a.freqs, mx::float32, s));
  for (const auto& rows : {a.positions, a.key_start}) {
    if (rows) inputs.push_back(mx::astype(*rows, mx::int32, s));
  }
  auto outs = mx::array::make_arrays({{static_cast<int>(B), 1, a.n_q_heads * static_cast<int>(D)}, k_cache.shape(),
                                      v_cache.shape()},
                                     {mx::float32, mx::float32, mx::float32},
                                     std::make_shared<CpuDecodeAttention>(s, a), inputs);
  return std::make_tuple(outs[0], outs[1], outs[2]);
}

}  // namespace mlex
