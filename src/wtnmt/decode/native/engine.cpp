// wtnmt's native search: decode/search.py's greedy and beam search, and the model's decoder
// step (model/transformer.py's decode_step over model/cache.py's buffers), in C++ over the
// same ATen operators, the same packed float32 and int8 products, in the same order. What
// leaves Python is the interpreter and its dispatch around ~250 operator calls a step. With
// ``fused`` off every number is computed as the PyTorch engine computes it; on, attention
// (with the branched sublayer's first FFN products) runs in attention.h's kernels, greedy's
// log-softmax and choice of token in search_ops.h's greedy_pick and beam search's log-softmax
// and choice of extensions in its beam_pick, the same arithmetic up to the order of float32
// sums (and the last bits of its exp); and where the CPU has VNNI the int8 products in
// int8.h's kernel, the same quantisation of the same int8 weights (network.py's
// own_int8_lanes). The float32 products are oneDNN's or MKL's, as the PyTorch engine's
// (model/float32_kernels.py).
//
// An ensemble's search holds several decoders (decoder.h), each step's distribution
// decode/ensemble.py's log Σ_m w_m P_m, in the same operators.
//
// Built on first use by torch.utils.cpp_extension (decode/native/__init__.py).

#include <torch/extension.h>

#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "beam.h"
#include "decoder.h"
#include "search_ops.h"

namespace {

using namespace wtnmt_native;

using Tensors = std::vector<Tensor>;
using Biases = std::vector<std::optional<Tensor>>;

class Engine {
 public:
  // ``models``: one decoder, or an ensemble's; ``log_weights`` [M]: log w_m (Σ w_m = 1;
  // empty for one model).
  Engine(std::vector<std::shared_ptr<Decoder>> models, Tensor log_weights, int64_t pad,
         int64_t bos, int64_t eos, bool fused)
      : models_(std::move(models)),
        log_weights_(std::move(log_weights)),
        pad_(pad),
        bos_(bos),
        eos_(eos),
        fused_(fused) {
    TORCH_CHECK(!models_.empty(), "an engine searches at least one model");
    TORCH_CHECK(models_.size() == 1 || log_weights_.numel() == int64_t(models_.size()),
                "an ensemble takes a log weight a model");
  }

  // Greedy search: the chosen tokens [B, T] (PAD after a sentence's EOS) and each step's
  // log-probability of them [B, T]; decode/search.py's greedy_search makes hypotheses of them.
  // After the forced ``prefix`` [B, P] (PAD-padded; P may be 0); with ``keys`` [B] (not empty),
  // each token drawn as decode/sampling.py draws it instead of the most probable.
  // (Each of ``cross_k``, ``cross_v``, ``cross_bias``: a model's layers' source side.)
  std::tuple<Tensor, Tensor> greedy(std::vector<Tensors> cross_k, std::vector<Tensors> cross_v,
                                    std::vector<Biases> cross_bias, Tensor limit,
                                    int64_t min_len, Tensor prefix, Tensor keys,
                                    double temperature, int64_t top_k, double top_p) {
    at::NoGradGuard no_grad;
    const int64_t b = limit.size(0);
    const int64_t first_forced = limit.min().item<int64_t>();
    const int64_t steps = limit.max().item<int64_t>() + 1;  // step t = limit forces EOS
    std::vector<State> st = start(cross_k, cross_v, cross_bias, steps, 1);
    Tensor tokens = at::full({b, steps + 1}, pad_, limit.options());
    tokens.select(1, 0).fill_(bos_);
    Tensor done = at::zeros({b}, limit.options().dtype(at::kBool));
    Tensor best = at::empty({b, steps}, limit.options().dtype(at::kFloat));  // chosen lprobs
    limit = limit.contiguous();
    int64_t taken = 0;
    for (int64_t t = 0; t < steps; ++t) {
      ++taken;
      const bool forcing = t < prefix.size(1), sampling = keys.numel() > 0;
      if (fused_ && !forcing && !sampling && models_.size() == 1) {  // the log-softmax in it
        Tensor logits =
            models_[0]->step(tokens.select(1, t), t, st[0], std::nullopt, nullptr).to(at::kFloat);
        logits = logits.contiguous();
        if (greedy_pick(logits, t, min_len, limit, done, tokens.select(1, t + 1), best.select(1, t),
                        pad_, bos_, eos_))
          break;
        continue;
      }
      Tensor lprobs = next(tokens.select(1, t), t, st, std::nullopt, nullptr);
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
  std::vector<std::vector<Hyp>> beam(std::vector<Tensors> cross_k, std::vector<Tensors> cross_v,
                                     std::vector<Biases> cross_bias, Tensor limit,
                                     int64_t min_len, int64_t beam, double alpha, bool fairseq,
                                     Tensor target_prefix) {
    at::NoGradGuard no_grad;
    const int64_t b = limit.size(0);
    const int64_t first_forced = limit.min().item<int64_t>();
    const int64_t steps = limit.max().item<int64_t>() + 1;
    std::vector<State> st = start(cross_k, cross_v, cross_bias, steps, beam);
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
      const Tensor last = prefix.select(1, prefix.size(1) - 1);
      Tensor top, origin, token;
      // fused, one model, past the forced prefix, a vocabulary of more than four blocks:
      // search_ops.h's beam_pick on the logits
      if (fused_ && models_.size() == 1 && t >= target_prefix.size(1) &&
          models_[0]->vocab_size() > 4 * kBlock) {
        Tensor logits = models_[0]->step(last, t, st[0], own, &path).to(at::kFloat).contiguous();
        std::tie(top, origin, token) =
            beam_pick(logits, scores, t, min_len, forced, pad_, bos_, eos_, 2 * beam);
      } else {
        Tensor lprobs = next(last, t, st, own, &path).view({n, group, -1});
        constrain(lprobs, t, min_len, forced, pad_, bos_, eos_);
        if (t < target_prefix.size(1))  // the forced prefix of the sentences still searched
          force_tokens(lprobs, target_prefix.index_select(0, active).select(1, t), pad_);
        std::tie(top, origin, token) = top_extensions(lprobs, scores, 2 * beam);
      }
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
      if (sentences)
        for (State& s : st) Decoder::shrink(s, *sentences);
    }
    return finished;
  }

 private:
  std::vector<State> start(std::vector<Tensors>& cross_k, std::vector<Tensors>& cross_v,
                           std::vector<Biases>& cross_bias, int64_t steps, int64_t width) const {
    TORCH_CHECK(cross_k.size() == models_.size() && cross_v.size() == models_.size() &&
                    cross_bias.size() == models_.size(),
                "a source side a model");
    std::vector<State> st;
    for (size_t m = 0; m < models_.size(); ++m)
      st.push_back(models_[m]->start(std::move(cross_k[m]), std::move(cross_v[m]),
                                     std::move(cross_bias[m]), steps, width));
    return st;
  }

  // The next token's log-probabilities [N, V]: the model's, or the ensemble's
  // log Σ_m w_m P_m (decode/ensemble.py's _EnsembleStepper, the same operators).
  Tensor next(const Tensor& tokens, int64_t t, std::vector<State>& st,
              const std::optional<Tensor>& own, const Tensor* path) {
    if (models_.size() == 1)
      return at::log_softmax(models_[0]->step(tokens, t, st[0], own, path).to(at::kFloat), -1);
    Tensors each;
    for (size_t m = 0; m < models_.size(); ++m)
      each.push_back(
          at::log_softmax(models_[m]->step(tokens, t, st[m], own, path).to(at::kFloat), -1));
    return at::logsumexp(at::stack(each) + log_weights_.view({-1, 1, 1}), 0);
  }

  std::vector<std::shared_ptr<Decoder>> models_;
  Tensor log_weights_;
  int64_t pad_, bos_, eos_;
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
                       std::vector<Tensor> branched, bool swish) {
        Layer l;
        l.cross_kind = cross_kind;
        l.swish = swish;
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
  py::class_<Decoder, std::shared_ptr<Decoder>>(m, "Decoder")
      .def(py::init<Tensor, double, Tensor, int64_t, bool, std::vector<Tensor>, Product,
                    std::vector<Layer>, bool>());
  py::class_<Engine>(m, "Engine")
      .def(py::init<std::vector<std::shared_ptr<Decoder>>, Tensor, int64_t, int64_t, int64_t,
                    bool>())
      .def("greedy", &Engine::greedy, py::call_guard<py::gil_scoped_release>())
      .def("beam", &Engine::beam, py::call_guard<py::gil_scoped_release>());
}
