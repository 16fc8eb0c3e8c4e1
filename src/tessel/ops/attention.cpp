// Op family: attention (Attention 23/24 with KV cache, LinearAttention, FlexAttention) and RoPE.
#include <algorithm>
#include <cmath>

#include "tessel/ir/op_registry.h"
#include "tessel/ops/decompose_util.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

// Q/K/V geometry after the 3-D (B, S, H*D) inputs are viewed as 4-D (B, H, S, D).
struct AttnDims {
  int64_t b = 0, hq = 0, hkv = 0, s = 0, l = 0, p = 0, t = 0, d = 0, dv = 0;
  bool three_d = false;
};

// Dims of Q/K/V (with unknown extents allowed during inference).
AttnDims attn_dims(const Node& n, const Shape& q, const Shape& k, const Shape& v,
                   const Shape* past) {
  AttnDims a;
  if (q.size() != k.size() || q.size() != v.size() || (q.size() != 3 && q.size() != 4))
    fail("Attention Q, K, V must all be 3-D or all 4-D, got {} {} {}", shape_str(q), shape_str(k),
         shape_str(v));
  a.three_d = q.size() == 3;
  a.b = q[0];
  if (a.three_d) {
    a.hq = n.attr_i("q_num_heads", 0);
    a.hkv = n.attr_i("kv_num_heads", 0);
    if (a.hq <= 0 || a.hkv <= 0) fail("3-D Attention needs positive q_num_heads and kv_num_heads");
    a.s = q[1];
    a.l = k[1];
    auto split = [](int64_t hidden, int64_t heads, const char* what) {
      if (hidden == kUnknownDim) return kUnknownDim;
      if (hidden % heads != 0)
        fail("Attention {} hidden size {} is not divisible by {} heads", what, hidden, heads);
      return hidden / heads;
    };
    a.d = split(q[2], a.hq, "Q");
    const int64_t dk = split(k[2], a.hkv, "K");
    if (a.d != kUnknownDim && dk != kUnknownDim && a.d != dk)
      fail("Attention Q and K head sizes differ");
    a.dv = split(v[2], a.hkv, "V");
  } else {
    a.hq = q[1];
    a.hkv = k[1];
    a.s = q[2];
    a.l = k[2];
    a.d = q[3];
    if (k[3] != kUnknownDim && a.d != kUnknownDim && k[3] != a.d)
      fail("Attention Q and K head sizes differ");
    a.dv = v[3];
    if (v[1] != kUnknownDim && a.hkv != kUnknownDim && v[1] != a.hkv)
      fail("Attention K and V head counts differ");
  }
  if (a.hq != kUnknownDim && a.hkv != kUnknownDim && (a.hkv <= 0 || a.hq % a.hkv != 0))
    fail("Attention q heads {} must be a multiple of kv heads {}", a.hq, a.hkv);
  a.p = 0;
  if (past) {
    if (past->size() != 4) fail("Attention past_key must be 4-D, got {}", shape_str(*past));
    a.p = (*past)[2];
  }
  a.t = (a.l == kUnknownDim || a.p == kUnknownDim) ? kUnknownDim : a.l + a.p;
  return a;
}


// ---- decomposition helpers ----------------------------------------------------------------------


// A [B, S, H*D] input viewed as [B, H, S, D]; 4-D inputs are already in that layout.
Value* heads_first(CoreBuilder& b, Value* x, int64_t heads) {
  const Shape& s = x->type.shape;
  if (s.size() == 4) return x;
  return b.transpose(b.reshape(x, {s[0], s[1], heads, s[2] / heads}), {0, 2, 1, 3});
}

// [B, HKV, T, D] repeated to [B, HKV*G, T, D]: query head h reads kv head h / G.
Value* repeat_kv(CoreBuilder& b, Value* x, int64_t group) {
  if (group == 1) return x;
  const Shape& s = x->type.shape;
  Value* e = b.emit(CoreOp::broadcast_in_dim, {x},
                    {{"shape", std::vector<int64_t>{s[0], s[1], group, s[2], s[3]}},
                     {"dims", std::vector<int64_t>{0, 1, 3, 4}}});
  return b.reshape(e, {s[0], s[1] * group, s[2], s[3]});
}

// Batched over dims 0, 1 of two 4-D operands: contract lhs dim 3 with rhs dim `rc`.
Value* bmm(CoreBuilder& b, Value* lhs, Value* rhs, int64_t rc) {
  return b.emit(CoreOp::dot_general, {lhs, rhs},
                {{"lhs_batch", std::vector<int64_t>{0, 1}},
                 {"rhs_batch", std::vector<int64_t>{0, 1}},
                 {"lhs_contract", std::vector<int64_t>{3}},
                 {"rhs_contract", std::vector<int64_t>{rc}}});
}

// Softmax over the last axis of a 4-D score tensor.
Value* softmax_last(CoreBuilder& b, Value* x) {
  Value* e = b.emit(CoreOp::exp, {b.sub(x, b.reduce(x, "max", {3}, true))});
  return b.div(e, b.reduce(e, "sum", {3}, true));
}

// [B, H, S, DV] back to the layout of the query: [B, S, H*DV] for 3-D inputs.
Value* heads_back(CoreBuilder& b, Value* y, bool three_d) {
  if (!three_d) return y;
  const Shape& s = y->type.shape;
  return b.reshape(b.transpose(y, {0, 2, 1, 3}), {s[0], s[2], s[1] * s[3]});
}

OpDef attention_def() {
  OpDef d;
  d.name = "Attention";
  d.min_inputs = 3;
  d.max_inputs = 7;
  d.min_outputs = 1;
  d.max_outputs = 4;
  d.since = 23;
  d.attrs = {{"is_causal", AttrKind::i},
             {"kv_num_heads", AttrKind::i},
             {"q_num_heads", AttrKind::i},
             {"qk_matmul_output_mode", AttrKind::i},
             {"scale", AttrKind::f},
             {"softcap", AttrKind::f},
             {"softmax_precision", AttrKind::i}};
  d.infer = [](InferCtx& c) {
    const DType dt = c.in(0).dtype;
    if (!is_float(dt)) fail("Attention needs float Q, got {}", dtype_name(dt));
    if (c.in(1).dtype != dt || c.in(2).dtype != dt) fail("Attention Q, K, V dtypes differ");
    if (c.has_in(4) != c.has_in(5)) fail("Attention needs both past_key and past_value or neither");
    AttnDims a = attn_dims(c.node(), c.in(0).shape, c.in(1).shape, c.in(2).shape,
                           c.has_in(4) ? &c.in(4).shape : nullptr);
    const int64_t mode = c.node().attr_i("qk_matmul_output_mode", 0);
    if (mode < 0 || mode > 3) fail("qk_matmul_output_mode must be 0..3, got {}", mode);
    if (c.has_in(6) && c.in(6).dtype != DType::i64) fail("nonpad_kv_seqlen must be int64");
    if (a.three_d) {
      const int64_t h = a.dv == kUnknownDim ? kUnknownDim : a.hq * a.dv;
      c.set_out(0, {dt, {a.b, a.s, h}});
    } else {
      c.set_out(0, {dt, {a.b, a.hq, a.s, a.dv}});
    }
    if (c.num_outputs() > 1 && c.node().outputs[1]) c.set_out(1, {dt, {a.b, a.hkv, a.t, a.d}});
    if (c.num_outputs() > 2 && c.node().outputs[2]) c.set_out(2, {dt, {a.b, a.hkv, a.t, a.dv}});
    if (c.num_outputs() > 3 && c.node().outputs[3]) c.set_out(3, {dt, {a.b, a.hq, a.s, a.t}});
  };
  d.kernel = [](KernelCtx& c) {
    const Node& node = c.node();
    const Tensor& q = c.in(0);
    const Tensor& k = c.in(1);
    const Tensor& v = c.in(2);
    const bool has_past = c.has_in(4) && c.has_in(5);
    if (c.has_in(4) != c.has_in(5)) fail("Attention needs both past_key and past_value or neither");
    AttnDims a =
        attn_dims(node, q.shape(), k.shape(), v.shape(), has_past ? &c.in(4).shape() : nullptr);
    if (k.dim(0) != a.b || v.dim(0) != a.b) fail("Attention batch sizes differ");
    if (a.three_d ? v.dim(1) != a.l : v.dim(2) != a.l)
      fail("Attention K and V sequence lengths differ");
    const int64_t B = a.b, HQ = a.hq, HKV = a.hkv, S = a.s, L = a.l, P = a.p, T = a.t, D = a.d,
                  DV = a.dv;
    const int64_t group = HQ / HKV;
    if (has_past) {
      const Shape& pk = c.in(4).shape();
      const Shape& pv = c.in(5).shape();
      if (pk != Shape{B, HKV, P, D} || pv.size() != 4 || pv[0] != B || pv[1] != HKV || pv[2] != P ||
          pv[3] != DV)
        fail("Attention past_key {} / past_value {} do not match K/V", shape_str(pk),
             shape_str(pv));
    }
    const std::vector<double> qv = q.to_f64(), kv = k.to_f64(), vv = v.to_f64();
    const std::vector<double> pk = has_past ? c.in(4).to_f64() : std::vector<double>{};
    const std::vector<double> pvv = has_past ? c.in(5).to_f64() : std::vector<double>{};
    // Element (b, h, s, x) of a 4-D view of a 3-D or 4-D Q/K/V input with `heads` heads of `dim`.
    auto at = [&](const std::vector<double>& src, int64_t heads, int64_t seq, int64_t dim,
                  int64_t b, int64_t h, int64_t s, int64_t x) {
      return a.three_d ? src[(b * seq + s) * heads * dim + h * dim + x]
                       : src[((b * heads + h) * seq + s) * dim + x];
    };
    // The present caches: past followed by the new keys/values.
    std::vector<double> kc(static_cast<size_t>(B * HKV * T * D)),
        vc(static_cast<size_t>(B * HKV * T * DV));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < HKV; ++h)
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t x = 0; x < D; ++x)
            kc[((b * HKV + h) * T + t) * D + x] =
                t < P ? pk[((b * HKV + h) * P + t) * D + x] : at(kv, HKV, L, D, b, h, t - P, x);
          for (int64_t x = 0; x < DV; ++x)
            vc[((b * HKV + h) * T + t) * DV + x] =
                t < P ? pvv[((b * HKV + h) * P + t) * DV + x] : at(vv, HKV, L, DV, b, h, t - P, x);
        }
    // Additive mask, broadcast (right-aligned) to (B, HQ, S, T); a shorter last dim is padded
    // with -inf.
    std::vector<double> mask;
    Shape ms;
    std::vector<int64_t> mstr;
    if (c.has_in(3)) {
      const Tensor& m = c.in(3);
      ms = m.shape();
      if (ms.size() < 2 || ms.size() > 4)
        fail("Attention attn_mask must have rank 2..4, got {}", shape_str(ms));
      if (ms.back() > T)
        fail("Attention attn_mask last dim {} exceeds total sequence length {}", ms.back(), T);
      if (m.dtype() == DType::boolean) {
        mask.resize(static_cast<size_t>(m.numel()));
        for (int64_t i = 0; i < m.numel(); ++i) mask[i] = m.get_i(i) ? 0.0 : -INFINITY;
      } else {
        if (m.dtype() != q.dtype()) fail("Attention float attn_mask must have Q's dtype");
        mask = m.to_f64();
      }
      while (ms.size() < 4) ms.insert(ms.begin(), 1);
      const Shape full = {B, HQ, S, ms[3]};
      for (int i = 0; i < 3; ++i)
        if (ms[i] != 1 && ms[i] != full[i])
          fail("Attention attn_mask {} does not broadcast to {}", shape_str(m.shape()),
               shape_str(full));
      mstr = strides_of(ms);
      for (int i = 0; i < 4; ++i)
        if (ms[i] == 1) mstr[i] = 0;
    }
    std::vector<int64_t> nonpad;
    if (c.has_in(6)) {
      nonpad = c.in(6).to_i64();
      if (static_cast<int64_t>(nonpad.size()) != B) fail("nonpad_kv_seqlen must have {} values", B);
    }
    const bool causal = node.attr_i("is_causal", 0) != 0;
    const double scale =
        node.has_attr("scale") ? node.attr_f("scale") : 1.0 / std::sqrt(static_cast<double>(D));
    const double softcap = node.attr_f("softcap", 0.0);
    const int64_t mode = node.attr_i("qk_matmul_output_mode", 0);
    const bool want_qk = c.wants_out(3);

    std::vector<double> y(static_cast<size_t>(B * HQ * S * DV));
    std::vector<double> qk(want_qk ? static_cast<size_t>(B * HQ * S * T) : 0);
    std::vector<double> sc(static_cast<size_t>(T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < HQ; ++h) {
        const int64_t kh = h / group;
        const double* kb = kc.data() + (b * HKV + kh) * T * D;
        const double* vb = vc.data() + (b * HKV + kh) * T * DV;
        for (int64_t i = 0; i < S; ++i) {
          double* qko = want_qk ? qk.data() + ((b * HQ + h) * S + i) * T : nullptr;
          for (int64_t j = 0; j < T; ++j) {
            double s = 0;
            for (int64_t x = 0; x < D; ++x) s += at(qv, HQ, S, D, b, h, i, x) * kb[j * D + x];
            sc[j] = s * scale;
          }
          if (qko && mode == 0) std::copy(sc.begin(), sc.end(), qko);
          if (softcap > 0)
            for (double& s : sc) s = softcap * std::tanh(s / softcap);
          if (qko && mode == 1) std::copy(sc.begin(), sc.end(), qko);
          // Causal rows see keys up to their own position, offset by the cached prefix (or, with
          // nonpad_kv_seqlen, by the per-batch valid length).
          const int64_t offset = nonpad.empty() ? P : nonpad[b] - S;
          double bias_max = -INFINITY;
          for (int64_t j = 0; j < T; ++j) {
            double bj = 0;
            if (!mask.empty()) {
              bj += j < ms[3] ? mask[b * mstr[0] + h * mstr[1] + i * mstr[2] + j * mstr[3]]
                              : -INFINITY;
            }
            if (causal && j > i + offset) bj += -INFINITY;
            if (!nonpad.empty() && j >= nonpad[b]) bj += -INFINITY;
            bias_max = std::max(bias_max, bj);
            sc[j] += bj;
          }
          if (qko && mode == 2) std::copy(sc.begin(), sc.end(), qko);
          // Softmax; a row whose every key is masked attends to nothing (zeros, not NaN).
          if (bias_max == -INFINITY) {
            std::fill(sc.begin(), sc.end(), 0.0);
          } else {
            double mx = -INFINITY;
            for (double s : sc) mx = std::max(mx, s);
            double sum = 0;
            for (double& s : sc) {
              s = std::exp(s - mx);
              sum += s;
            }
            for (double& s : sc) s /= sum;
          }
          if (qko && mode == 3) std::copy(sc.begin(), sc.end(), qko);
          double* yo = y.data() + ((b * HQ + h) * S + i) * DV;
          for (int64_t j = 0; j < T; ++j) {
            if (sc[j] == 0.0) continue;
            for (int64_t x = 0; x < DV; ++x) yo[x] += sc[j] * vb[j * DV + x];
          }
        }
      }
    const DType dt = q.dtype();
    if (a.three_d) {
      // (B, HQ, S, DV) -> (B, S, HQ*DV)
      std::vector<double> y3(y.size());
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < HQ; ++h)
          for (int64_t i = 0; i < S; ++i)
            for (int64_t x = 0; x < DV; ++x)
              y3[((b * S + i) * HQ + h) * DV + x] = y[((b * HQ + h) * S + i) * DV + x];
      c.set_out(0, Tensor::from_f64(dt, {B, S, HQ * DV}, y3));
    } else {
      c.set_out(0, Tensor::from_f64(dt, {B, HQ, S, DV}, y));
    }
    if (c.wants_out(1)) c.set_out(1, Tensor::from_f64(dt, {B, HKV, T, D}, kc));
    if (c.wants_out(2)) c.set_out(2, Tensor::from_f64(dt, {B, HKV, T, DV}, vc));
    if (want_qk) c.set_out(3, Tensor::from_f64(dt, {B, HQ, S, T}, qk));
  };

  // Scores, softcap, masks and softmax as the kernel orders them; present key/value are the past
  // concatenated with the new keys/values. Only the outputs the node uses are produced.
  d.decompose = [](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    const DType dt = n.inputs[0]->type.dtype, ct = math_type(dt);
    const bool has_past = n.has_input(4);
    AttnDims a = attn_dims(n, n.inputs[0]->type.shape, n.inputs[1]->type.shape, n.inputs[2]->type.shape,
                           has_past ? &n.inputs[4]->type.shape : nullptr);
    Value* q = heads_first(b, n.inputs[0], a.hq);
    Value* k = heads_first(b, n.inputs[1], a.hkv);
    Value* v = heads_first(b, n.inputs[2], a.hkv);
    if (has_past) {
      k = b.concat({n.inputs[4], k}, 2);
      v = b.concat({n.inputs[5], v}, 2);
    }
    std::vector<Value*> out(n.outputs.size(), nullptr);
    if (out.size() > 1) out[1] = k;
    if (out.size() > 2) out[2] = v;
    const int64_t group = a.hq / a.hkv;
    const double scale = n.has_attr("scale") ? n.attr_f("scale") : 1.0 / std::sqrt(static_cast<double>(a.d));
    Value* sc = b.mul(bmm(b, b.convert(q, ct), repeat_kv(b, b.convert(k, ct), group), 3), b.scalar(ct, scale));
    const int64_t mode = n.attr_i("qk_matmul_output_mode", 0);
    std::vector<Value*> stage(4, nullptr);  // the scores after each step, for qk_matmul_output
    stage[0] = sc;
    const double softcap = n.attr_f("softcap", 0.0);
    if (softcap > 0) {
      Value* cap = b.scalar(ct, softcap);
      sc = b.mul(b.emit(CoreOp::tanh, {b.div(sc, cap)}), cap);
    }
    stage[1] = sc;
    // The additive bias: attn_mask (bool: 0 / -inf; a short last dim padded with -inf), causal
    // and nonpad_kv_seqlen masks.
    const Shape full = {a.b, a.hq, a.s, a.t};
    Value* ninf = b.scalar(ct, -INFINITY);
    Value* bias = nullptr;
    auto add_bias = [&](Value* t) { bias = bias ? b.add(bias, t) : b.broadcast_to(t, full); };
    if (n.has_input(3)) {
      Value* m = n.inputs[3];
      m = m->type.dtype == DType::boolean ? b.select(m, b.scalar(ct, 0.0), ninf) : b.convert(m, ct);
      const Shape& ms = m->type.shape;
      if (ms.back() < a.t) {
        std::vector<int64_t> lo(ms.size(), 0), hi(ms.size(), 0);
        hi.back() = a.t - ms.back();
        m = b.emit(CoreOp::pad, {m, ninf}, {{"low", lo}, {"high", hi}});
      }
      add_bias(m);
    }
    Value* nonpad = n.has_input(6) ? n.inputs[6] : nullptr;
    auto per_batch = [&](Value* t) {  // [B] i64 -> full
      return b.emit(CoreOp::broadcast_in_dim, {t}, {{"shape", std::vector<int64_t>(full)}, {"dims", std::vector<int64_t>{0}}});
    };
    Value* col = (n.attr_i("is_causal", 0) != 0 || nonpad) ? b.iota(DType::i64, full, 3) : nullptr;
    if (n.attr_i("is_causal", 0) != 0) {
      // Row i sees keys j <= i + offset (the cached prefix, or nonpad_kv_seqlen - S).
      Value* limit = b.iota(DType::i64, full, 2);
      limit = nonpad ? b.add(limit, per_batch(b.sub(nonpad, b.scalar(DType::i64, static_cast<double>(a.s)))))
                     : b.add(limit, b.scalar(DType::i64, static_cast<double>(a.p)));
      add_bias(b.select(b.compare("gt", col, limit), ninf, b.scalar(ct, 0.0)));
    }
    if (nonpad) add_bias(b.select(b.compare("ge", col, per_batch(nonpad)), ninf, b.scalar(ct, 0.0)));
    if (bias) sc = b.add(sc, bias);
    stage[2] = sc;
    Value* p = softmax_last(b, sc);
    if (bias) {
      // A row whose every key is masked attends to nothing (zeros, not NaN).
      Value* dead = b.compare("eq", b.reduce(bias, "max", {3}, true), ninf);
      p = b.select(dead, b.scalar(ct, 0.0), p);
    }
    stage[3] = p;
    out[0] = b.convert(heads_back(b, bmm(b, p, repeat_kv(b, b.convert(v, ct), group), 2), a.three_d), dt);
    if (out.size() > 3 && n.outputs[3]) out[3] = b.convert(stage[mode], dt);
    for (size_t i = 1; i < out.size(); ++i)
      if (!n.outputs[i]) out[i] = nullptr;
    return out;
  };
  return d;
}

// ---- RotaryEmbedding ----------------------------------------------------------------------------

OpDef rotary_embedding_def() {
  OpDef d;
  d.name = "RotaryEmbedding";
  d.min_inputs = 3;
  d.max_inputs = 4;
  d.since = 23;
  d.attrs = {{"interleaved", AttrKind::i},
             {"num_heads", AttrKind::i},
             {"rotary_embedding_dim", AttrKind::i}};
  d.infer = [](InferCtx& c) {
    const TensorType& x = c.in(0);
    if (!is_float(x.dtype)) fail("RotaryEmbedding needs a float input");
    if (x.shape.size() != 3 && x.shape.size() != 4)
      fail("RotaryEmbedding input must be 3-D or 4-D, got {}", shape_str(x.shape));
    if (x.shape.size() == 3 && c.node().attr_i("num_heads", 0) <= 0)
      fail("3-D RotaryEmbedding needs num_heads");
    if (c.in(1).dtype != x.dtype || c.in(2).dtype != x.dtype)
      fail("RotaryEmbedding caches must have the input's dtype");
    c.set_out(0, x);
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& x = c.in(0);
    const Tensor& cosc = c.in(1);
    const Tensor& sinc = c.in(2);
    const bool interleaved = c.node().attr_i("interleaved", 0) != 0;
    // View the input as (B, S, H, D): 4-D inputs are (B, H, S, D), 3-D ones (B, S, H*D).
    int64_t B, S, H, D;
    const bool three_d = x.rank() == 3;
    if (three_d) {
      H = c.node().attr_i("num_heads", 0);
      if (H <= 0 || x.dim(2) % H != 0)
        fail("RotaryEmbedding hidden size {} not divisible by num_heads {}", x.dim(2), H);
      B = x.dim(0);
      S = x.dim(1);
      D = x.dim(2) / H;
    } else if (x.rank() == 4) {
      B = x.dim(0);
      H = x.dim(1);
      S = x.dim(2);
      D = x.dim(3);
    } else {
      fail("RotaryEmbedding input must be 3-D or 4-D");
    }
    int64_t rot = c.node().attr_i("rotary_embedding_dim", 0);
    if (rot == 0) rot = D;
    if (rot < 0 || rot > D || rot % 2 != 0)
      fail("rotary_embedding_dim {} must be even and <= head size {}", rot, D);
    const int64_t half = rot / 2;
    const bool has_pos = c.has_in(3);
    std::vector<int64_t> pos;
    if (has_pos) {
      pos = c.in(3).to_i64();
      if (c.in(3).shape() != Shape{B, S}) fail("position_ids must have shape [{}, {}]", B, S);
      if (cosc.rank() != 2 || sinc.shape() != cosc.shape() || cosc.dim(1) < half)
        fail("cos/sin caches must be [max_pos, >= {}] with position_ids", half);
    } else if (cosc.rank() != 3 || sinc.shape() != cosc.shape() || cosc.dim(0) != B ||
               cosc.dim(1) != S || cosc.dim(2) < half) {
      fail("cos/sin caches must be [{}, {}, >= {}] without position_ids", B, S, half);
    }
    const int64_t cw = cosc.dim(cosc.rank() - 1);
    const std::vector<double> xv = x.to_f64(), cv = cosc.to_f64(), sv = sinc.to_f64();
    std::vector<double> y = xv;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s) {
        int64_t row = b * S + s;
        if (has_pos) {
          row = pos[b * S + s];
          if (row < 0 || row >= cosc.dim(0))
            fail("position id {} out of range [0, {})", row, cosc.dim(0));
        }
        const double* cr = cv.data() + row * cw;
        const double* sr = sv.data() + row * cw;
        for (int64_t h = 0; h < H; ++h) {
          const int64_t base = three_d ? (b * S + s) * H * D + h * D : ((b * H + h) * S + s) * D;
          for (int64_t i = 0; i < half; ++i) {
            const int64_t i1 = interleaved ? base + 2 * i : base + i;
            const int64_t i2 = interleaved ? base + 2 * i + 1 : base + i + half;
            const double x1 = xv[i1], x2 = xv[i2];
            y[i1] = cr[i] * x1 - sr[i] * x2;
            y[i2] = sr[i] * x1 + cr[i] * x2;
          }
        }
      }
    c.set_out(0, Tensor::from_f64(x.dtype(), x.shape(), y));
  };
  // Rotate pairs (first/second half, or even/odd when interleaved) of the first
  // rotary_embedding_dim features by the cached cos/sin of each position.
  d.decompose = [](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    Value* x = n.inputs[0];
    const Shape xs = x->type.shape;
    const DType dt = x->type.dtype, ct = math_type(dt);
    const bool three_d = xs.size() == 3;
    // View as [B, S, H, D] (3-D) or keep [B, H, S, D].
    const int64_t H = three_d ? n.attr_i("num_heads") : xs[1];
    const Shape vs = three_d ? Shape{xs[0], xs[1], H, xs[2] / H} : xs;
    const int64_t B = vs[0], S = three_d ? vs[1] : vs[2], D = vs[3];
    int64_t rot = n.attr_i("rotary_embedding_dim", 0);
    if (rot == 0) rot = D;
    const int64_t half = rot / 2;
    // cos/sin as [B, S, half], from the [max_pos, w] caches through position_ids or directly.
    auto table = [&](Value* cache) {
      cache = b.convert(cache, ct);
      const Shape& cs = cache->type.shape;
      if (n.has_input(3)) {
        Value* pos = b.broadcast_to(b.reshape(n.inputs[3], {B * S, 1}), {B * S, half});
        return b.reshape(b.emit(CoreOp::gather, {cache, pos}, {{"axis", int64_t{0}}}), {B, S, half});
      }
      return b.slice(cache, {0, 0, 0}, {cs[0], cs[1], half});
    };
    // Broadcast [B, S, half] against the view's [.., half] slices.
    const Shape hs = three_d ? Shape{B, S, H, half} : Shape{B, H, S, half};
    const std::vector<int64_t> dims = three_d ? std::vector<int64_t>{0, 1, 3} : std::vector<int64_t>{0, 2, 3};
    auto spread = [&](Value* t) {
      return b.emit(CoreOp::broadcast_in_dim, {t}, {{"shape", std::vector<int64_t>(hs)}, {"dims", dims}});
    };
    Value* cs = spread(table(n.inputs[1]));
    Value* sn = spread(table(n.inputs[2]));
    Value* v = b.reshape(b.convert(x, ct), vs);
    const bool inter = n.attr_i("interleaved", 0) != 0;
    std::vector<int64_t> st(4, 0), sp(vs.begin(), vs.end()), stride(4, 1);
    auto part = [&](int64_t start, int64_t stop, int64_t step) {
      st[3] = start;
      sp[3] = stop;
      stride[3] = step;
      return b.slice(v, st, sp, stride);
    };
    Value* x1 = inter ? part(0, rot, 2) : part(0, half, 1);
    Value* x2 = inter ? part(1, rot, 2) : part(half, rot, 1);
    Value* y1 = b.sub(b.mul(cs, x1), b.mul(sn, x2));
    Value* y2 = b.add(b.mul(sn, x1), b.mul(cs, x2));
    Value* y;
    if (inter) {
      Shape one = hs;
      one.push_back(1);
      Shape rs = hs;
      rs[3] = rot;
      y = b.reshape(b.concat({b.reshape(y1, one), b.reshape(y2, one)}, 4), rs);
    } else {
      y = b.concat({y1, y2}, 3);
    }
    if (rot < D) y = b.concat({y, part(rot, D, 1)}, 3);
    return {b.convert(b.reshape(y, xs), dt)};
  };
  return d;
}

// ---- LinearAttention ----------------------------------------------------------------------------

// Recurrent linear attention: a per-(batch, kv head) state S of [dk, dv] is updated once per step
// by the update rule and read by every query head of the group as scale * q^T S.
OpDef linear_attention_def() {
  OpDef d;
  d.name = "LinearAttention";
  d.min_inputs = 3;
  d.max_inputs = 6;
  d.min_outputs = 1;
  d.max_outputs = 2;
  d.since = 27;
  d.attrs = {{"kv_num_heads", AttrKind::i, true},
             {"q_num_heads", AttrKind::i, true},
             {"scale", AttrKind::f},
             {"update_rule", AttrKind::s}};
  struct Dims {
    int64_t b, t, hq, hkv, dk, dv;
  };
  auto dims = [](const Node& n, const Shape& q, const Shape& k, const Shape& v) {
    if (q.size() != 3 || k.size() != 3 || v.size() != 3)
      fail("LinearAttention query/key/value must be 3-D [B, T, H*D], got {} {} {}", shape_str(q),
           shape_str(k), shape_str(v));
    Dims r{q[0], q[1], n.attr_i("q_num_heads"), n.attr_i("kv_num_heads"), kUnknownDim, kUnknownDim};
    if (r.hq <= 0 || r.hkv <= 0 || r.hq % r.hkv != 0)
      fail("LinearAttention q heads {} must be a multiple of kv heads {}", r.hq, r.hkv);
    if (q[2] != kUnknownDim) {
      if (q[2] % r.hq != 0)
        fail("LinearAttention query width {} not divisible by {} heads", q[2], r.hq);
      r.dk = q[2] / r.hq;
      if (k[2] != kUnknownDim && k[2] != r.dk * r.hkv)
        fail("LinearAttention key width {} should be {}", k[2], r.dk * r.hkv);
    }
    if (v[2] != kUnknownDim) {
      if (v[2] % r.hkv != 0)
        fail("LinearAttention value width {} not divisible by {} heads", v[2], r.hkv);
      r.dv = v[2] / r.hkv;
    }
    return r;
  };
  auto rule_of = [](const Node& n) {
    const std::string r = n.attr_s("update_rule", "gated_delta");
    if (r != "linear" && r != "gated" && r != "delta" && r != "gated_delta")
      fail("LinearAttention update_rule '{}' is unknown", r);
    return r;
  };
  d.infer = [dims, rule_of](InferCtx& c) {
    const DType dt = c.in(0).dtype;
    if (!is_float(dt) || c.in(1).dtype != dt || c.in(2).dtype != dt)
      fail("LinearAttention needs float q/k/v of one dtype");
    Dims a = dims(c.node(), c.in(0).shape, c.in(1).shape, c.in(2).shape);
    const std::string rule = rule_of(c.node());
    if ((rule == "gated" || rule == "gated_delta") && !c.has_in(4))
      fail("update_rule '{}' needs decay", rule);
    if ((rule == "delta" || rule == "gated_delta") && !c.has_in(5))
      fail("update_rule '{}' needs beta", rule);
    c.set_out(0, {dt, {a.b, a.t, a.dv == kUnknownDim ? kUnknownDim : a.hq * a.dv}});
    if (c.num_outputs() > 1 && c.node().outputs[1]) c.set_out(1, {dt, {a.b, a.hkv, a.dk, a.dv}});
  };
  d.kernel = [dims, rule_of](KernelCtx& c) {
    const Node& node = c.node();
    Dims a = dims(node, c.in(0).shape(), c.in(1).shape(), c.in(2).shape());
    const int64_t B = a.b, T = a.t, HQ = a.hq, HKV = a.hkv, DK = a.dk, DV = a.dv, G = HQ / HKV;
    if (c.in(1).dim(0) != B || c.in(1).dim(1) != T || c.in(2).dim(0) != B || c.in(2).dim(1) != T)
      fail("LinearAttention query/key/value batch or length differ");
    const std::string rule = rule_of(node);
    const bool gated = rule == "gated" || rule == "gated_delta",
               delta = rule == "delta" || rule == "gated_delta";
    const std::vector<double> q = c.in(0).to_f64(), k = c.in(1).to_f64(), v = c.in(2).to_f64();
    std::vector<double> st(static_cast<size_t>(B * HKV * DK * DV), 0.0);
    if (c.has_in(3)) {
      if (c.in(3).shape() != Shape{B, HKV, DK, DV})
        fail("LinearAttention past_state must be [{}, {}, {}, {}]", B, HKV, DK, DV);
      st = c.in(3).to_f64();
    }
    // decay: [B, T, HKV * DK] (per key dim) or [B, T, HKV] (per head), in log space.
    std::vector<double> dec;
    int64_t dw = 0;
    if (gated) {
      const Tensor& dt = c.in(4);
      if (dt.rank() != 3 || dt.dim(0) != B || dt.dim(1) != T ||
          (dt.dim(2) != HKV * DK && dt.dim(2) != HKV))
        fail("LinearAttention decay must be [B, T, {}] or [B, T, {}]", HKV * DK, HKV);
      dec = dt.to_f64();
      dw = dt.dim(2) / HKV;
    }
    // beta: [B, T, HKV] or [B, T, 1].
    std::vector<double> bet;
    int64_t bw = 0;
    if (delta) {
      const Tensor& bt = c.in(5);
      if (bt.rank() != 3 || bt.dim(0) != B || bt.dim(1) != T ||
          (bt.dim(2) != HKV && bt.dim(2) != 1))
        fail("LinearAttention beta must be [B, T, {}] or [B, T, 1]", HKV);
      bet = bt.to_f64();
      bw = bt.dim(2);
    }
    const double scale = node.has_attr("scale") && node.attr_f("scale") != 0.0
                             ? node.attr_f("scale")
                             : 1.0 / std::sqrt(static_cast<double>(DK));
    std::vector<double> out(static_cast<size_t>(B * T * HQ * DV)), ret(static_cast<size_t>(DV));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t bt = b * T + t;
        for (int64_t h = 0; h < HKV; ++h) {
          double* S = st.data() + (b * HKV + h) * DK * DV;
          const double* kt = k.data() + bt * HKV * DK + h * DK;
          const double* vt = v.data() + bt * HKV * DV + h * DV;
          if (gated)
            for (int64_t i = 0; i < DK; ++i) {
              const double g = std::exp(dec[bt * HKV * dw + h * dw + (dw == 1 ? 0 : i)]);
              for (int64_t j = 0; j < DV; ++j) S[i * DV + j] *= g;
            }
          if (delta) {
            // Write beta * (v - S^T k) instead of v: the delta rule corrects what S recalls for k.
            const double be = bet[bt * bw + (bw == 1 ? 0 : h)];
            std::fill(ret.begin(), ret.end(), 0.0);
            for (int64_t i = 0; i < DK; ++i)
              for (int64_t j = 0; j < DV; ++j) ret[j] += S[i * DV + j] * kt[i];
            for (int64_t j = 0; j < DV; ++j) ret[j] = be * (vt[j] - ret[j]);
          } else {
            std::copy(vt, vt + DV, ret.begin());
          }
          for (int64_t i = 0; i < DK; ++i)
            for (int64_t j = 0; j < DV; ++j) S[i * DV + j] += kt[i] * ret[j];
          for (int64_t g = 0; g < G; ++g) {
            const int64_t hq = h * G + g;
            const double* qt = q.data() + bt * HQ * DK + hq * DK;
            double* o = out.data() + bt * HQ * DV + hq * DV;
            for (int64_t i = 0; i < DK; ++i)
              for (int64_t j = 0; j < DV; ++j) o[j] += qt[i] * S[i * DV + j];
            for (int64_t j = 0; j < DV; ++j) o[j] *= scale;
          }
        }
      }
    const DType dt = c.in(0).dtype();
    c.set_out(0, Tensor::from_f64(dt, {B, T, HQ * DV}, out));
    if (c.wants_out(1)) c.set_out(1, Tensor::from_f64(dt, {B, HKV, DK, DV}, st));
  };
  // The recurrence unrolled over the (static) T steps, each a few batched products on the
  // [B, HKV, DK, DV] state.
  d.decompose = [dims, rule_of](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    const DType dt = n.inputs[0]->type.dtype, ct = math_type(dt);
    Dims a = dims(n, n.inputs[0]->type.shape, n.inputs[1]->type.shape, n.inputs[2]->type.shape);
    const int64_t B = a.b, T = a.t, HKV = a.hkv, DK = a.dk, DV = a.dv, G = a.hq / a.hkv;
    const std::string rule = rule_of(n);
    const bool gated = rule == "gated" || rule == "gated_delta", delta = rule == "delta" || rule == "gated_delta";
    const double scale = n.has_attr("scale") && n.attr_f("scale") != 0.0 ? n.attr_f("scale")
                                                                         : 1.0 / std::sqrt(static_cast<double>(DK));
    // [B, T, W] -> time-major [T, B, W]; step t is then a slice reshaped to `per_step`.
    auto time_major = [&](Value* x) { return b.transpose(b.convert(x, ct), {1, 0, 2}); };
    auto step = [&](Value* x, int64_t t, const Shape& per_step) {
      const Shape& s = x->type.shape;
      return b.reshape(b.slice(x, {t, 0, 0}, {t + 1, s[1], s[2]}), per_step);
    };
    auto spread = [&](Value* x, std::vector<int64_t> to) {
      return b.emit(CoreOp::broadcast_in_dim, {x}, {{"shape", std::vector<int64_t>{B, HKV, DK, DV}}, {"dims", to}});
    };
    Value* q = time_major(n.inputs[0]);
    Value* k = time_major(n.inputs[1]);
    Value* v = time_major(n.inputs[2]);
    Value* decay = gated ? time_major(n.inputs[4]) : nullptr;
    Value* beta = delta ? time_major(n.inputs[5]) : nullptr;
    Value* st = n.has_input(3) ? b.convert(n.inputs[3], ct) : b.full(ct, {B, HKV, DK, DV}, 0.0);
    std::vector<Value*> outs;
    for (int64_t t = 0; t < T; ++t) {
      Value* kt = step(k, t, {B, HKV, DK});
      if (gated) {
        const int64_t dw = decay->type.shape[2] / HKV;
        Value* g = b.emit(CoreOp::exp, {step(decay, t, {B, HKV, dw})});
        st = b.mul(st, dw == 1 ? spread(b.reshape(g, {B, HKV}), {0, 1}) : spread(g, {0, 1, 2}));
      }
      Value* w = step(v, t, {B, HKV, DV});
      if (delta) {
        // Write beta * (v - S^T k): the delta rule corrects what S recalls for k.
        Value* recall = b.emit(CoreOp::dot_general, {st, kt},
                               {{"lhs_batch", std::vector<int64_t>{0, 1}}, {"rhs_batch", std::vector<int64_t>{0, 1}},
                                {"lhs_contract", std::vector<int64_t>{2}}, {"rhs_contract", std::vector<int64_t>{2}}});
        const int64_t bw = beta->type.shape[2];
        Value* be = b.emit(CoreOp::broadcast_in_dim, {step(beta, t, {B, bw})},
                           {{"shape", std::vector<int64_t>{B, HKV, DV}}, {"dims", std::vector<int64_t>{0, 1}}});
        w = b.mul(be, b.sub(w, recall));
      }
      st = b.add(st, b.mul(spread(kt, {0, 1, 2}), spread(w, {0, 1, 3})));
      Value* qt = step(q, t, {B, HKV, G, DK});
      Value* o = b.emit(CoreOp::dot_general, {qt, st},
                        {{"lhs_batch", std::vector<int64_t>{0, 1}}, {"rhs_batch", std::vector<int64_t>{0, 1}},
                         {"lhs_contract", std::vector<int64_t>{3}}, {"rhs_contract", std::vector<int64_t>{2}}});
      outs.push_back(b.reshape(b.mul(o, b.scalar(ct, scale)), {B, 1, a.hq * DV}));
    }
    std::vector<Value*> out = {b.convert(b.concat(outs, 1), dt)};
    if (n.outputs.size() > 1) out.push_back(n.outputs[1] ? b.convert(st, dt) : nullptr);
    return out;
  };
  return d;
}

// ---- FlexAttention (ai.onnx.preview) ------------------------------------------------------------

// Plain scaled dot-product attention over 4-D inputs; a node with score_mod / prob_mod subgraphs is
// expanded into graph ops by the importer instead (src/tessel/frontend/onnx/expand.cpp).
OpDef flex_attention_def() {
  OpDef d;
  d.name = "FlexAttention";
  d.domain = "ai.onnx.preview";
  d.min_inputs = d.max_inputs = 3;
  d.since = 1;
  d.attrs = {{"scale", AttrKind::f}};
  d.infer = [](InferCtx& c) {
    const DType dt = c.in(0).dtype;
    const Shape& q = c.in(0).shape;
    const Shape& k = c.in(1).shape;
    const Shape& v = c.in(2).shape;
    if (!is_float(dt) || c.in(1).dtype != dt || c.in(2).dtype != dt)
      fail("FlexAttention needs float Q, K, V of one dtype");
    if (q.size() != 4 || k.size() != 4 || v.size() != 4) fail("FlexAttention inputs must be 4-D");
    if (q[1] != kUnknownDim && k[1] != kUnknownDim && (k[1] <= 0 || q[1] % k[1] != 0))
      fail("FlexAttention q heads {} must be a multiple of kv heads {}", q[1], k[1]);
    c.set_out(0, {dt, {q[0], q[1], q[2], v[3]}});
  };
  d.kernel = [](KernelCtx& c) {
    const Tensor& q = c.in(0);
    const Tensor& k = c.in(1);
    const Tensor& v = c.in(2);
    if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4) fail("FlexAttention inputs must be 4-D");
    const int64_t B = q.dim(0), HQ = q.dim(1), S = q.dim(2), D = q.dim(3);
    const int64_t HKV = k.dim(1), T = k.dim(2), DV = v.dim(3);
    if (k.dim(0) != B || v.dim(0) != B || v.dim(1) != HKV || v.dim(2) != T || k.dim(3) != D ||
        HKV <= 0 || HQ % HKV != 0)
      fail("FlexAttention Q {} K {} V {} do not match", shape_str(q.shape()), shape_str(k.shape()),
           shape_str(v.shape()));
    const int64_t G = HQ / HKV;
    const double scale = c.node().has_attr("scale") ? c.node().attr_f("scale")
                                                    : 1.0 / std::sqrt(static_cast<double>(D));
    const std::vector<double> qv = q.to_f64(), kv = k.to_f64(), vv = v.to_f64();
    std::vector<double> y(static_cast<size_t>(B * HQ * S * DV)), p(static_cast<size_t>(T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < HQ; ++h) {
        const double* kb = kv.data() + (b * HKV + h / G) * T * D;
        const double* vb = vv.data() + (b * HKV + h / G) * T * DV;
        for (int64_t i = 0; i < S; ++i) {
          const double* qr = qv.data() + ((b * HQ + h) * S + i) * D;
          double mx = -INFINITY;
          for (int64_t j = 0; j < T; ++j) {
            double s = 0;
            for (int64_t x = 0; x < D; ++x) s += qr[x] * kb[j * D + x];
            p[j] = s * scale;
            mx = std::max(mx, p[j]);
          }
          double sum = 0;
          for (double& e : p) {
            e = std::exp(e - mx);
            sum += e;
          }
          double* yo = y.data() + ((b * HQ + h) * S + i) * DV;
          for (int64_t j = 0; j < T; ++j)
            for (int64_t x = 0; x < DV; ++x) yo[x] += p[j] / sum * vb[j * DV + x];
        }
      }
    c.set_out(0, Tensor::from_f64(q.dtype(), {B, HQ, S, DV}, y));
  };
  d.decompose = [](CoreBuilder& b, const Node& n) -> std::vector<Value*> {
    const DType dt = n.inputs[0]->type.dtype, ct = math_type(dt);
    const Shape& qs = n.inputs[0]->type.shape;
    const int64_t group = qs[1] / n.inputs[1]->type.shape[1];
    const double scale = n.has_attr("scale") ? n.attr_f("scale") : 1.0 / std::sqrt(static_cast<double>(qs[3]));
    Value* q = b.convert(n.inputs[0], ct);
    Value* sc = b.mul(bmm(b, q, repeat_kv(b, b.convert(n.inputs[1], ct), group), 3), b.scalar(ct, scale));
    Value* y = bmm(b, softmax_last(b, sc), repeat_kv(b, b.convert(n.inputs[2], ct), group), 2);
    return {b.convert(y, dt)};
  };
  return d;
}

}  // namespace

void register_attention_ops(OpRegistry& r) {
  r.add(attention_def());
  r.add(rotary_embedding_def());
  r.add(linear_attention_def());
  r.add(flex_attention_def());
}

}  // namespace tessel
