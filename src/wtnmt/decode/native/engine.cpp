// wtnmt's native search: decode/search.py's greedy and beam search, and the model's decoder
// step (model/transformer.py's decode_step over model/cache.py's buffers), in C++ over the
// same ATen operators, the same packed float32 and int8 products, in the same order. What
// leaves Python is the interpreter and its dispatch around ~250 operator calls a step. With
// ``fused`` off every number is computed as the PyTorch engine computes it; on, attention (with the branched sublayer's first FFN products) runs in attention.h's
// kernels and greedy's log-softmax and choice of token in search_ops.h's greedy_pick, the
// same arithmetic up to the order of float32 sums (and the last bits of its exp); and where
// the CPU has VNNI the int8 products in int8.h's kernel, the same quantisation of the same
// int8 weights (network.py's own_int8_lanes). The float32 products are oneDNN's or MKL's, as
// the PyTorch engine's (model/float32_kernels.py).
//
// Built on first use by torch.utils.cpp_extension (decode/native/__init__.py).

#include <torch/extension.h>

#include <optional>
#include <tuple>
#include <vector>

#include "attention.h"
#include "beam.h"
#include "products.h"
#include "search_ops.h"

namespace {

using namespace wtnmt_native;

// One decoder layer's weights and shapes.
struct Layer {
  int cross_kind = 0;  // 0 multi-head + FFN, 1 branched (split FFNs), 2 branched (shared FFN)
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

class Engine {
 public:
  Engine(Tensor embedding, double scale, Tensor positions, int64_t pad, int64_t bos, int64_t eos,
         bool pre_norm, std::vector<Tensor> final_norm, Product output, std::vector<Layer> layers,
         bool fused)
      : embedding_(std::move(embedding)),
        scale_(scale),
        positions_(std::move(positions)),
        pad_(pad),
        bos_(bos),
        eos_(eos),
        pre_norm_(pre_norm),
        final_norm_(std::move(final_norm)),
        output_(std::move(output)),
        layers_(std::move(layers)),
        fused_(fused) {}

  // Greedy search: the chosen tokens [B, T] (PAD after a sentence's EOS) and each step's
  // log-probability of them [B, T]; decode/search.py's greedy_search makes hypotheses of them.
  // After the forced ``prefix`` [B, P] (PAD-padded; P may be 0); with ``keys`` [B] (not empty),
  // each token drawn as decode/sampling.py draws it instead of the most probable.
  std::tuple<Tensor, Tensor> greedy(std::vector<Tensor> cross_k, std::vector<Tensor> cross_v,
                                    std::vector<std::optional<Tensor>> cross_bias, Tensor limit,
                                    int64_t min_len, Tensor prefix, Tensor keys,
                                    double temperature, int64_t top_k, double top_p) {
    at::NoGradGuard no_grad;
    const int64_t b = limit.size(0);
    const int64_t first_forced = limit.min().item<int64_t>();
    const int64_t steps = limit.max().item<int64_t>() + 1;  // step t = limit forces EOS
    State st = start(std::move(cross_k), std::move(cross_v), std::move(cross_bias), steps, 1);
    Tensor tokens = at::full({b, steps + 1}, pad_, limit.options());
    tokens.select(1, 0).fill_(bos_);
    Tensor done = at::zeros({b}, limit.options().dtype(at::kBool));
    Tensor best = at::empty({b, steps}, embedding_.options());  // the chosen tokens' lprobs
    limit = limit.contiguous();
    int64_t taken = 0;
    for (int64_t t = 0; t < steps; ++t) {
      Tensor logits = step(tokens.select(1, t), t, st, std::nullopt, nullptr).to(at::kFloat);
      ++taken;
      const bool forcing = t < prefix.size(1), sampling = keys.numel() > 0;
      if (fused_ && !forcing && !sampling) {  // the search's own step, the log-softmax in it
        logits = logits.contiguous();
        if (greedy_pick(logits, t, min_len, limit, done, tokens.select(1, t + 1), best.select(1, t),
                        pad_, bos_, eos_))
          break;
        continue;
      }
      Tensor lprobs = at::log_softmax(logits, -1);
      std::optional<Tensor> forced;
      if (t >= first_forced) forced = limit.le(t);
      constrain(lprobs, t, min_len, forced, pad_, bos_, eos_);
      if (forcing) force_tokens(lprobs.view({b, 1, -1}), prefix.select(1, t), pad_);
      Tensor token = sampling ? sample_pick(lprobs, uniforms(keys, t), temperature, top_k, top_p)
                              : row_argmax(lprobs);
      best.select(1, t).copy_(lprobs.gather(1, token.unsqueeze(1)).select(1, 0));
      tokens.select(1, t + 1).copy_(token.masked_fill_(done, pad_));
      done.bitwise_or_(token.eq(eos_));
      if (done.all().item<bool>()) break;
    }
    return {tokens.narrow(1, 1, taken), best.narrow(1, 0, taken)};
  }

  // Beam search: every sentence's finished hypotheses (at most ``beam``), in the order they
  // finished; decode/search.py's beam_search ranks them and keeps the n best.
  std::vector<std::vector<Hyp>> beam(std::vector<Tensor> cross_k, std::vector<Tensor> cross_v,
                                     std::vector<std::optional<Tensor>> cross_bias, Tensor limit,
                                     int64_t min_len, int64_t beam, double alpha, bool fairseq,
                                     Tensor target_prefix) {
    at::NoGradGuard no_grad;
    const int64_t b = limit.size(0);
    const int64_t first_forced = limit.min().item<int64_t>();
    const int64_t steps = limit.max().item<int64_t>() + 1;
    State st = start(std::move(cross_k), std::move(cross_v), std::move(cross_bias), steps, beam);
    auto longs = limit.options();
    Tensor prefix = at::full({b, 1}, bos_, longs);
    Tensor scores = at::zeros({b, 1}, longs.dtype(at::kFloat));
    Tensor active = at::arange(b, longs);
    Tensor path = at::zeros({b, 0}, longs);  // the slot of each step on each prefix
    std::vector<std::vector<Hyp>> finished(b);
    for (int64_t t = 0; t < steps; ++t) {
      const int64_t n = scores.size(0), group = scores.size(1);
      std::optional<Tensor> forced;
      if (t >= first_forced) forced = limit.le(t);
      // model/transformer.py's decode_step: this step's slot of each hypothesis on its path,
      // and the bias leaving each one its own slots (model/cache.py's own_slot_bias)
      Tensor slot = at::remainder(at::arange(n * group, longs), group);
      path = at::cat({path, slot.unsqueeze(1)}, 1);  // [N, t+1]
      std::optional<Tensor> own;  // (the fused attention follows the paths themselves)
      if (!fused_) {
        const int64_t width = beam, seen = path.size(1);
        Tensor cols = at::arange(seen, longs) * width + path;
        own = at::full({n * group, seen * width}, kNegInf, longs.dtype(at::kFloat))
                  .scatter_(1, cols, 0.0)
                  .view({n, group, seen * width});
      }
      Tensor logits = step(prefix.select(1, prefix.size(1) - 1), t, st, own, &path);
      Tensor lprobs = at::log_softmax(logits.to(at::kFloat), -1).view({n, group, -1});
      constrain(lprobs, t, min_len, forced, pad_, bos_, eos_);
      if (t < target_prefix.size(1))  // the forced prefix of the sentences still searched
        force_tokens(lprobs, target_prefix.index_select(0, active).select(1, t), pad_);
      auto [top, origin, token] = top_extensions(lprobs, scores, 2 * beam);
      std::optional<Tensor> rows, sentences;
      bool usual = top.size(1) >= beam;
      if (usual) {
        Tensor odd = token.narrow(1, 0, beam)
                         .eq(eos_)
                         .any()
                         .bitwise_or(top.select(1, beam - 1).isneginf().any());
        usual = !odd.item<bool>();
      }
      if (usual) {  // no EOS among the best K, which all live on
        top = top.narrow(1, 0, beam);
        origin = origin.narrow(1, 0, beam);
        token = token.narrow(1, 0, beam);
      } else {
        bool go_on = settle(top, origin, token, scores, prefix, active, finished, beam, alpha,
                            fairseq, eos_, rows);
        if (!go_on) break;
        if (rows) {  // some sentences are done: the source side shrinks
          sentences = rows;
          active = active.index_select(0, *rows);
          limit = limit.index_select(0, *rows);
        }
      }
      Tensor kept = rows ? *rows : at::arange(n, longs);
      Tensor index = (kept.unsqueeze(1) * group + origin).view({-1});  // [n'·K]
      prefix = at::cat({prefix.index_select(0, index), token.reshape({-1, 1})}, 1);
      scores = top;
      path = path.index_select(0, index);
      if (sentences) shrink(st, *sentences);
    }
    return finished;
  }

 private:
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
        Tensor hid = apply(l.fc1, h.reshape({n, d})).relu_();
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

  Tensor embedding_;
  double scale_;
  Tensor positions_;
  int64_t pad_, bos_, eos_;
  bool pre_norm_;
  std::vector<Tensor> final_norm_;
  Product output_;
  std::vector<Layer> layers_;
  bool fused_;
};

Int8 int8_params(const py::object& packed) {
  // a ScriptObject of quantized::linear_prepack (model/packed.py's pack_int8)
  auto object = py::cast<torch::jit::Object>(packed);
  return c10::IValue(object._ivalue()).toCustomClass<LinearPackedParamsBase>();
}

Product product(int kind, Tensor weight, std::optional<Tensor> bias, const py::object& int8) {
  Product p;
  p.kind = kind;
  p.weight = std::move(weight);
  p.bias = std::move(bias);
  if (kind == 1) p.int8 = int8_params(int8);
  if (kind == 3) p.own = py::cast<std::shared_ptr<Int8Weight>>(int8);
  return p;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "wtnmt's native greedy and beam search (decode/native)";
  m.def("kernels", [] { return kernel_width(); }, "floats a vector in the kernels that run");
  m.def("cpu_kernels", &cpu_kernel_width, "the most floats a vector this CPU's kernels take");
  m.def("set_kernels", [](int width) {
    TORCH_CHECK(width == 4 || width == 8 || width == 16, "kernels: 4, 8 or 16 floats a vector");
    TORCH_CHECK(width <= cpu_kernel_width(), "this CPU runs kernels of at most ",
                cpu_kernel_width(), " floats a vector");
    kernel_width() = width;
  });
  py::class_<Product>(m, "Product")
      .def(py::init(&product), py::arg("kind"), py::arg("weight"), py::arg("bias"),
           py::arg("int8"));
  py::class_<Int8Weight, std::shared_ptr<Int8Weight>>(m, "Int8Weight")
      .def(py::init([](const Tensor& q, const Tensor& scale, std::optional<Tensor> bias,
                       int lanes) {
             return std::make_shared<Int8Weight>(int8_weight(q, scale, bias, lanes));
           }),
           py::arg("q"), py::arg("scale"), py::arg("bias"), py::arg("lanes"))
      .def(
          "__call__",
          [](const Int8Weight& w, const Tensor& x) {  // (the encoder's: decode/native/network.py)
            RECORD_FUNCTION("wtnmt::int8_product", std::vector<c10::IValue>({x}));
            return int8_product(x, w);
          },
          py::call_guard<py::gil_scoped_release>());
  m.def("int8_builds", &int8_builds, "the builds of the int8 kernel this CPU runs, widest first");
  py::class_<Layer>(m, "Layer")
      .def(py::init([](int cross_kind, int64_t self_heads, int64_t self_dk, int64_t cross_heads,
                       int64_t cross_dk, std::vector<Product> products, std::vector<Tensor> norms,
                       std::vector<Tensor> branched) {
        Layer l;
        l.cross_kind = cross_kind;
        l.self_heads = self_heads;
        l.self_dk = self_dk;
        l.cross_heads = cross_heads;
        l.cross_dk = cross_dk;
        TORCH_CHECK(products.size() == 6, "a layer takes six products");
        l.qkv = products[0];
        l.self_out = products[1];
        l.cross_q = products[2];
        l.cross_out = products[3];
        l.fc1 = products[4];
        l.fc2 = products[5];
        TORCH_CHECK(norms.size() == 6, "a layer takes six norm tensors");
        for (int j = 0; j < 6; ++j) l.norms[j] = norms[j];
        TORCH_CHECK(branched.size() == 3, "a layer takes fused, b1, alpha");
        l.fused = branched[0];
        l.b1 = branched[1];
        l.alpha = branched[2];
        return l;
      }));
  py::class_<Engine>(m, "Engine")
      .def(py::init<Tensor, double, Tensor, int64_t, int64_t, int64_t, bool, std::vector<Tensor>,
                    Product, std::vector<Layer>, bool>())
      .def("greedy", &Engine::greedy, py::call_guard<py::gil_scoped_release>())
      .def("beam", &Engine::beam, py::call_guard<py::gil_scoped_release>());
}
