// One model's decoder for engine.cpp's search: its weights (Layer), the source side and
// self-attention buffers of one search (State), and the step of model/transformer.py's
// decode_step over them (Decoder::step), the same ATen operators, packed products and
// kernels in the same order. An ensemble's search holds several.

#pragma once

#include <torch/extension.h>

#include <optional>
#include <vector>

#include "attention.h"
#include "products.h"
#include "search_ops.h"

namespace wtnmt_native {

// One decoder layer's weights and shapes.
struct Layer {
  int cross_kind = 0;  // 0 multi-head + FFN, 1 branched (split FFNs), 2 branched (shared FFN)
  bool swish = false;  // the FFN's activation: swish (model.activation), else ReLU
  int64_t self_heads = 0, self_dk = 0, cross_heads = 0, cross_dk = 0;  // (cross: branches kept)
  // self_out: W^O packed, or the weighted self-attention's Σ α_i κ_i W^{O_i} (a matmul);
  // cross_out: W^O, or the branched sublayer's tail
  Product qkv, self_out, cross_q, cross_out, fc1, fc2;
  Tensor norms[6];          // each residual's layer norm: weight, bias (self, cross, FFN)
  Tensor fused, b1, alpha;  // branched: W_i = κ_i W^{O_i} W1_i, b1, α (shared FFN)
};

// The source side and the self-attention buffers of one search (model/cache.py's LayerCache).
struct State {
  std::vector<Tensor> cross_k, cross_v;           // [H, B, S, Dk], keys ×1/√Dk
  std::vector<std::optional<Tensor>> cross_bias;  // [H·B, 1, S] or none (no padding)
  std::vector<Tensor> self_k, self_v;             // [H, B, steps, W, Dk]
};

// One model's decoder step (model/transformer.py's decode_step).
class Decoder {
 public:
  Decoder(Tensor embedding, double scale, Tensor positions, int64_t pad, bool pre_norm,
          std::vector<Tensor> final_norm, Product output, std::vector<Layer> layers, bool fused)
      : embedding_(std::move(embedding)),
        scale_(scale),
        positions_(std::move(positions)),
        pad_(pad),
        pre_norm_(pre_norm),
        final_norm_(std::move(final_norm)),
        output_(std::move(output)),
        layers_(std::move(layers)),
        fused_(fused) {}

  // The buffers of a search of ``steps`` steps, ``width`` hypotheses a sentence.
  State start(std::vector<Tensor> cross_k, std::vector<Tensor> cross_v,
              std::vector<std::optional<Tensor>> cross_bias, int64_t steps, int64_t width) const {
    State st{std::move(cross_k), std::move(cross_v), std::move(cross_bias), {}, {}};
    for (size_t i = 0; i < layers_.size(); ++i) {
      st.cross_k[i] = st.cross_k[i].contiguous();  // (the fused attention reads them raw)
      st.cross_v[i] = st.cross_v[i].contiguous();
      if (st.cross_bias[i]) st.cross_bias[i] = st.cross_bias[i]->contiguous();
      const Layer& l = layers_[i];
      const int64_t b = st.cross_k[i].size(1);
      auto shape = std::vector<int64_t>{l.self_heads, b, steps, width, l.self_dk};
      st.self_k.push_back(at::zeros(shape, embedding_.options()));
      st.self_v.push_back(at::zeros(shape, embedding_.options()));
    }
    return st;
  }

  // Keep the source sentences ``sentences`` only.
  static void shrink(State& st, const Tensor& sentences) {
    for (size_t i = 0; i < st.cross_k.size(); ++i) {
      st.cross_k[i] = st.cross_k[i].index_select(1, sentences);
      st.cross_v[i] = st.cross_v[i].index_select(1, sentences);
      st.self_k[i] = st.self_k[i].index_select(1, sentences);
      st.self_v[i] = st.self_v[i].index_select(1, sentences);
      if (st.cross_bias[i]) {
        const Tensor& bias = *st.cross_bias[i];
        const int64_t h = st.cross_k[i].size(0), s = bias.size(-1);
        st.cross_bias[i] = bias.view({h, -1, 1, s}).index_select(1, sentences).view({-1, 1, s});
      }
    }
  }

  Tensor norm(const Tensor& x, const Tensor& w, const Tensor& b) const {
    return at::layer_norm(x, {x.size(-1)}, w, b);
  }

  // One step of N = B·G hypotheses, tokens [N] → logits [N, V] (decode_step).
  Tensor step(const Tensor& tokens, int64_t t, State& st, const std::optional<Tensor>& own,
              const Tensor* path) {
    const int64_t n = tokens.size(0), d = embedding_.size(1);
    Tensor x = at::embedding(embedding_, tokens.unsqueeze(1), pad_) * scale_ +
               positions_.narrow(0, t, 1);  // [N, 1, D]
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      const int64_t b = st.cross_k[i].size(1), group = n / b;
      // self-attention over each hypothesis' own prefix
      {
        Tensor h = pre_norm_ ? norm(x, l.norms[0], l.norms[1]) : x;
        const int64_t heads = l.self_heads, dk = l.self_dk;
        if (fused_) {
          Tensor qkv = apply(l.qkv, h.reshape({n, d})).contiguous();
          Tensor concat = at::empty({n, heads * dk}, qkv.options());
          const Tensor* slots = st.self_k[i].size(3) > 1 ? path : nullptr;
          fused_self(qkv, st.self_k[i], st.self_v[i], slots, t, heads, dk, concat);
          x = residual(x, apply(l.self_out, concat).view({n, 1, -1}), l.norms[0], l.norms[1]);
        } else {
          Tensor qkv = apply(l.qkv, h.reshape({n, d}))
                           .view({n, 1, 3, heads, dk})
                           .permute({2, 3, 0, 1, 4});  // [3, H, N, 1, Dk]
          Tensor& keys_buf = st.self_k[i];
          Tensor& values_buf = st.self_v[i];
          const int64_t width = keys_buf.size(3);
          Tensor k_slot = keys_buf.select(2, t).narrow(2, 0, group);
          at::mul_out(k_slot, qkv[1].view({heads, b, group, dk}), scalar(std::pow(dk, -0.5)));
          values_buf.select(2, t).narrow(2, 0, group).copy_(qkv[2].view({heads, b, group, dk}));
          Tensor keys = keys_buf.narrow(2, 0, t + 1).reshape({heads * b, (t + 1) * width, dk});
          Tensor values = values_buf.narrow(2, 0, t + 1).reshape({heads * b, (t + 1) * width, dk});
          Tensor scores = at::bmm(qkv[0].reshape({heads * b, group, dk}), keys.transpose(1, 2));
          if (width > 1) scores.view({heads, b, group, (t + 1) * width}).add_(*own);
          Tensor heads_out = at::bmm(scores.softmax(-1), values).view({heads, n, 1, dk});
          Tensor concat = heads_out.permute({1, 2, 0, 3}).reshape({n, heads * dk});
          Tensor out = apply(l.self_out, concat).view({n, 1, -1});
          x = residual(x, out, l.norms[0], l.norms[1]);
        }
      }
      // cross-attention (and the FFN, or the branches' FFNs)
      {
        Tensor h = pre_norm_ ? norm(x, l.norms[2], l.norms[3]) : x;
        const int64_t heads = l.cross_heads, dk = l.cross_dk;
        Tensor heads_out;  // [H, N, 1, Dk] (the fused multi-head path: its concatenation)
        Tensor out;
        if (fused_) {
          Tensor q = apply(l.cross_q, h.reshape({n, d})).contiguous();
          if (l.cross_kind == 1) {  // with the branches' first FFN products
            Tensor hid = at::empty({n, heads * l.fused.size(2)}, q.options());
            fused_cross_branched(q, st.cross_k[i], st.cross_v[i], st.cross_bias[i], heads, dk,
                                 l.fused, l.b1, hid);
            out = apply(l.cross_out, hid).view({n, 1, -1});
          } else {
            const bool head_major = l.cross_kind != 0;
            heads_out = head_major ? at::empty({heads, n, 1, dk}, q.options())
                                   : at::empty({n, heads * dk}, q.options());
            fused_cross(q, st.cross_k[i], st.cross_v[i], st.cross_bias[i], heads, dk, head_major,
                        heads_out);
            if (!head_major) out = apply(l.cross_out, heads_out).view({n, 1, -1});
          }
        } else {
          Tensor q = apply(l.cross_q, h.reshape({n, d}))
                         .view({n, 1, 1, heads, dk})
                         .permute({2, 3, 0, 1, 4})[0];  // [H, N, 1, Dk]
          const Tensor& k = st.cross_k[i];
          const int64_t s = k.size(2);
          Tensor q3 = q.reshape({heads * b, group, dk});
          Tensor k_t = k.view({heads * b, s, dk}).transpose(1, 2);
          Tensor scores =
              st.cross_bias[i] ? at::baddbmm(*st.cross_bias[i], q3, k_t) : at::bmm(q3, k_t);
          heads_out = at::bmm(scores.softmax(-1), st.cross_v[i].view({heads * b, s, dk}))
                          .view({heads, n, 1, dk});
          if (l.cross_kind == 0) {
            Tensor concat = heads_out.permute({1, 2, 0, 3}).reshape({n, heads * dk});
            out = apply(l.cross_out, concat).view({n, 1, -1});
          }
        }
        if (!out.defined()) {  // the branches' FFNs, where no kernel above has run them
          Tensor flat = heads_out.reshape({heads, n, dk});
          if (l.cross_kind == 1) {
            Tensor hid = at::baddbmm(l.b1.unsqueeze(1), flat, l.fused).relu_();
            Tensor concat = hid.permute({1, 0, 2}).reshape({n, -1});
            out = apply(l.cross_out, concat).view({n, 1, -1});
          } else {
            Tensor hid = at::baddbmm(l.b1, flat, l.fused).relu_();
            Tensor weighted = at::einsum("m,mnf->nf", {l.alpha, hid});
            out = apply(l.cross_out, weighted).view({n, 1, -1});
          }
        }
        x = residual(x, out, l.norms[2], l.norms[3]);
      }
      if (l.cross_kind == 0) {  // the Transformer's FFN sublayer
        Tensor h = pre_norm_ ? norm(x, l.norms[4], l.norms[5]) : x;
        Tensor hid = apply(l.fc1, h.reshape({n, d}));
        hid = l.swish ? at::silu_(hid) : hid.relu_();
        Tensor out = apply(l.fc2, hid).view({n, 1, -1});
        x = residual(x, out, l.norms[4], l.norms[5]);
      }
    }
    if (pre_norm_) x = norm(x, final_norm_[0], final_norm_[1]);
    return apply(output_, x.select(1, 0));
  }

  Tensor residual(const Tensor& x, const Tensor& out, const Tensor& w, const Tensor& b) const {
    Tensor sum = x + out;
    return pre_norm_ ? sum : norm(sum, w, b);
  }

  int64_t vocab_size() const { return embedding_.size(0); }

 private:
  Tensor embedding_;
  double scale_;
  Tensor positions_;
  int64_t pad_;
  bool pre_norm_;
  std::vector<Tensor> final_norm_;
  Product output_;
  std::vector<Layer> layers_;
  bool fused_;
};

}  // namespace wtnmt_native
