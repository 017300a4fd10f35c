#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "core/memory_budget.h"
#include "core/parallel_for.h"
#include "kernels/backward_kernel.h"
#include "kernels/kernel.h"
#include "qkv/error.h"
#include "qkv/layer.h"
#include "qkv/layer_backward.h"

namespace qkv::train {
namespace {

// splitmix64: three independent streams from one seed.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
constexpr std::uint64_t kInitStream = 1, kTrainStream = 2, kHeldoutStream = 3,
                        kDropoutStream = 4;
Rng stream(std::uint64_t seed, std::uint64_t which) { return Rng(mix(seed * 4 + which)); }

TensorView view_of(const std::vector<float>& v, Shape shape, std::string name) {
  TensorView t;
  t.data = v.data();
  t.dtype = DType::kF32;
  t.strides = contiguous_strides(shape);
  t.shape = std::move(shape);
  t.name = std::move(name);
  return t;
}

LayerWeights layer_weights(const Model& m, std::size_t l) {
  const Shape sq = {m.d, m.d};
  LayerWeights w{view_of(m.wq[l], sq, "wq"), view_of(m.wk[l], sq, "wk"),
                 view_of(m.wv[l], sq, "wv")};
  w.wo = view_of(m.wo[l], sq, "wo");
  return w;
}

LayerOptions layer_options(const TrainConfig& c) {
  LayerOptions o;
  o.heads = c.heads;
  o.attention.causal = true;
  o.attention.threads = c.threads;
  if (c.attention_dtype == DType::kBF16) o.attention.dtype = DType::kBF16;
  return o;
}

struct Grads {
  std::vector<float> table_a, table_b, readout, readout_bias;
  std::vector<std::vector<float>> wq, wk, wv, wo;
};

void add_tensor(std::vector<float>& into, const Tensor& t) {
  const float* p = t.data_as<float>();
  for (std::size_t i = 0; i < into.size(); ++i) into[i] += p[i];
}

// Layer l's options at training step `step` (0: evaluation, no dropout): dropout keyed by the
// step's seed, the layer as its offset, so that no two layers or steps share a mask.
LayerOptions step_options(const TrainConfig& c, int step, std::size_t l) {
  LayerOptions o = layer_options(c);
  if (step > 0 && c.dropout > 0.0) {
    o.attention.dropout_p = c.dropout;
    o.attention.seed = mix(mix(c.seed * 8 + kDropoutStream) + static_cast<std::uint64_t>(step));
    o.attention.dropout_offset = static_cast<std::uint32_t>(l);
  }
  return o;
}

// Forward over a batch of sequences; returns x_0..x_L (each [B·N·d]) and fills the layer states.
// `step` > 0: a training step's forward (with dropout when asked for).
std::vector<std::vector<float>> forward(const Model& m, const TrainConfig& c,
                                        const std::vector<Sequence>& batch,
                                        std::vector<LayerForwardState>* states, int step = 0) {
  const auto b = static_cast<std::int64_t>(batch.size());
  const std::int64_t n = batch.front().length();
  const auto row = static_cast<std::size_t>(n * m.d);
  std::vector<std::vector<float>> xs(static_cast<std::size_t>(c.layers) + 1);
  xs[0].resize(static_cast<std::size_t>(b) * row);
  for (std::size_t i = 0; i < batch.size(); ++i)
    embed(batch[i], c.task.task, m.table_a, m.table_b, m.d, xs[0].data() + i * row);
  for (std::size_t l = 0; l < static_cast<std::size_t>(c.layers); ++l) {
    const LayerOptions options = step_options(c, step, l);
    const TensorView x = view_of(xs[l], {b, n, m.d}, "x");
    LayerResult y = states != nullptr
                        ? multi_head_attention(x, layer_weights(m, l), options, std::nullopt,
                                               (*states)[l])
                        : multi_head_attention(x, layer_weights(m, l), options);
    xs[l + 1] = xs[l];
    const float* py = y.out.data_as<float>();
    for (std::size_t i = 0; i < xs[l + 1].size(); ++i) xs[l + 1][i] += py[i];
  }
  return xs;
}

}  // namespace

void validate(const TrainConfig& c) {
  auto need = [](bool ok, const char* subject, const std::string& problem) {
    if (!ok) throw Error(subject, problem);
  };
  need(c.task.vocab >= 2, "--vocab", "must be at least 2");
  need(c.task.pairs >= 1 && c.task.pairs <= c.task.vocab, "--pairs",
       "must be between 1 and --vocab (keys in a sequence are distinct)");
  need(c.d_model >= 1 && c.heads >= 1 && c.d_model % c.heads == 0, "--heads",
       "must divide --d-model");
  need(c.layers >= 1, "--layers", "must be at least 1");
  need(c.dropout >= 0.0 && c.dropout < 1.0, "--dropout", "must be in [0, 1)");
  if (c.task.task == Task::kMqar) {
    need(sequence_length(c.task) > 2 * c.task.pairs, "--seq-len",
         "must exceed 2·--pairs (room for at least one query)");
  }
  need(c.steps >= 0 && c.batch >= 1 && c.eval_every >= 1 && c.heldout >= 1, "--steps",
       "steps must be >= 0, batch, eval interval and held-out count >= 1");
}

std::uint64_t TrainMemory::total() const noexcept {
  return core::saturating_add(core::saturating_add(parameters, activations), layer_call);
}

TrainMemory train_memory(const TrainConfig& c) {
  using core::saturating_add;
  using core::saturating_mul;
  const auto u = [](std::int64_t x) {
    return static_cast<std::uint64_t>(std::max<std::int64_t>(x, 0));
  };
  const std::uint64_t f = sizeof(float);
  const std::int64_t n = sequence_length(c.task), d = c.d_model;
  const bool recall = c.task.task == Task::kRecall;
  const std::int64_t vocab_a = recall ? c.task.vocab : 2 * std::int64_t{c.task.vocab};
  const std::int64_t vocab_b = recall ? c.task.vocab : n;
  // Parameters: embeddings, 4 [d, d] projections per layer, the readout and its bias.
  std::uint64_t params = saturating_mul(u(vocab_a) + u(vocab_b), u(d));
  params = saturating_add(params, saturating_mul(4 * u(c.layers), saturating_mul(u(d), u(d))));
  params = saturating_add(params, saturating_mul(u(d) + 1, u(c.task.vocab)));
  TrainMemory m;
  // The values, Adam's two moments, the step's gradients and the tensors --out encodes (twice:
  // the copies and their encoding).
  m.parameters = saturating_mul(saturating_mul(params, 6), f);
  // A step's activations, in floats: x_0..x_L and dx (each B·N·d), and each layer's saved Q, K,
  // V and heads (B·N·d each) and lse (B·H·N).
  const std::int64_t batch = std::max(c.batch, std::min(c.heldout, 64));
  const std::uint64_t a = saturating_mul(saturating_mul(u(batch), u(n)), u(d));
  const std::uint64_t lse = saturating_mul(saturating_mul(u(batch), u(n)), u(c.heads));
  std::uint64_t act = saturating_mul(u(c.layers) + 2, a);
  act = saturating_add(act, saturating_mul(u(c.layers), saturating_add(saturating_mul(4, a), lse)));
  m.activations = saturating_mul(act, f);
  // The largest layer call: the forward as multi_head_attention counts it, or the backward: the
  // gradients of its weights (4 [d, d]), its row matrices (dY, dConcat, dQ, dK, dV as rows and
  // as heads, X, dX: 10 of B·N·d) and attention_backward's own gradients and workspace.
  const int threads = core::resolve_thread_count(c.threads);
  const std::int64_t dk = c.heads > 0 ? d / c.heads : 0;
  const core::AttentionShape shape{batch, c.heads, c.heads, n, n, dk, dk};
  const core::LayerShape layer{batch, n, n, d, d, c.heads, c.heads, dk, dk, d, false, true,
                               DType::kF32};
  AttentionOptions forward_options;
  forward_options.causal = true;
  forward_options.return_lse = true;
  const std::uint64_t forward =
      core::layer_memory(layer, forward_options,
                         kernels::attention_workspace_bytes(shape, threads, "", DType::kF32))
          .total();
  const std::uint64_t weight_gradients = saturating_mul(4, saturating_mul(u(d), u(d)));
  std::uint64_t backward =
      saturating_mul(saturating_add(saturating_mul(10, a), weight_gradients), f);
  backward = saturating_add(
      backward, kernels::backward_memory(shape, threads, DType::kF32, false).total());
  m.layer_call = std::max(forward, backward);
  return m;
}

std::string token_label(const Sequence& s, Task task, int vocab, int t) {
  const auto ut = static_cast<std::size_t>(t);
  if (s.target[ut] >= 0) return "?k" + std::to_string(s.key[ut]);
  if (task == Task::kRecall)
    return "k" + std::to_string(s.key[ut]) + ":v" + std::to_string(s.value[ut]);
  return s.key[ut] < vocab ? "k" + std::to_string(s.key[ut])
                           : "v" + std::to_string(s.key[ut] - vocab);
}

Sequence heldout_sequence(const TrainConfig& c, int index) {
  Rng rng = stream(c.seed, kHeldoutStream);
  Sequence s;
  for (int i = 0; i <= index; ++i) s = make_sequence(c.task, rng);
  return s;
}

double evaluate(const Model& m, const TrainConfig& c, int count) {
  Rng rng = stream(c.seed, kHeldoutStream);
  int total = 0, correct = 0;
  constexpr int kChunk = 64;
  for (int done = 0; done < count; done += kChunk) {
    std::vector<Sequence> batch;
    for (int i = done; i < std::min(count, done + kChunk); ++i)
      batch.push_back(make_sequence(c.task, rng));
    const auto xs = forward(m, c, batch, nullptr);
    const auto row = static_cast<std::size_t>(batch.front().length() * m.d);
    for (std::size_t i = 0; i < batch.size(); ++i)
      readout_loss(batch[i], xs.back().data() + i * row, m.d, m.classes, m.readout,
                   m.readout_bias, 1.0f, nullptr, nullptr, nullptr, &total, &correct);
  }
  return total == 0 ? 0.0 : static_cast<double>(correct) / total;
}

std::vector<float> layer_input(const Model& m, const TrainConfig& c, const Sequence& s,
                               int layer) {
  return forward(m, c, {s}, nullptr)[static_cast<std::size_t>(layer)];
}

TrainResult train(const TrainConfig& c, const std::function<void(const CurvePoint&)>& progress) {
  validate(c);
  const auto start = std::chrono::steady_clock::now();
  TrainResult result;
  Model& m = result.model;
  const int n = sequence_length(c.task);
  m.d = c.d_model;
  m.classes = c.task.vocab;
  const auto ud = static_cast<std::size_t>(m.d);
  if (c.task.task == Task::kRecall) {
    m.vocab_a = c.task.vocab;
    m.vocab_b = c.task.vocab;
  } else {
    m.vocab_a = 2 * c.task.vocab;
    m.vocab_b = n;
  }
  // Initialisation: embeddings N(0, 1), projections and readout N(0, 1/d) (unit-variance
  // outputs for unit-variance inputs), biases zero; drawn in this order from the init stream.
  Rng init = stream(c.seed, kInitStream);
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(m.d));
  m.table_a = init_normal(static_cast<std::size_t>(m.vocab_a) * ud, 1.0f, init);
  m.table_b = init_normal(static_cast<std::size_t>(m.vocab_b) * ud, 1.0f, init);
  for (int l = 0; l < c.layers; ++l) {
    m.wq.push_back(init_normal(ud * ud, w_scale, init));
    m.wk.push_back(init_normal(ud * ud, w_scale, init));
    m.wv.push_back(init_normal(ud * ud, w_scale, init));
    m.wo.push_back(init_normal(ud * ud, w_scale, init));
  }
  m.readout = init_normal(ud * static_cast<std::size_t>(m.classes), w_scale, init);
  m.readout_bias.assign(static_cast<std::size_t>(m.classes), 0.0f);

  std::vector<std::vector<float>*> params = {&m.table_a, &m.table_b, &m.readout, &m.readout_bias};
  for (int l = 0; l < c.layers; ++l) {
    const auto ul = static_cast<std::size_t>(l);
    params.insert(params.end(), {&m.wq[ul], &m.wk[ul], &m.wv[ul], &m.wo[ul]});
  }
  std::vector<AdamState> adam;
  for (auto* p : params) adam.emplace_back(p->size());

  Rng data = stream(c.seed, kTrainStream);
  const auto row = static_cast<std::size_t>(n) * ud;
  double loss_since = 0.0;
  int steps_since = 0;
  auto last_point = start;
  for (int step = 1; step <= c.steps; ++step) {
    std::vector<Sequence> batch;
    for (int i = 0; i < c.batch; ++i) batch.push_back(make_sequence(c.task, data));
    std::vector<LayerForwardState> states(static_cast<std::size_t>(c.layers));
    const auto xs = forward(m, c, batch, &states, step);

    // The loss is the mean over every target position of the batch.
    int targets = 0;
    for (const auto& s : batch)
      for (int t : s.target) targets += t >= 0 ? 1 : 0;
    const float scale = 1.0f / static_cast<float>(std::max(targets, 1));
    std::vector<std::vector<float>> grads;
    for (auto* p : params) grads.emplace_back(p->size(), 0.0f);
    std::vector<float> dx(xs.back().size());
    double loss = 0.0;
    int count = 0, correct = 0;
    for (std::size_t i = 0; i < batch.size(); ++i)
      loss += readout_loss(batch[i], xs.back().data() + i * row, m.d, m.classes, m.readout,
                           m.readout_bias, scale, dx.data() + i * row, &grads[2], &grads[3],
                           &count, &correct);
    loss /= std::max(count, 1);

    // Back through the layers: the residual passes dx through, the layer adds its dX.
    const auto b = static_cast<std::int64_t>(batch.size());
    for (int l = c.layers - 1; l >= 0; --l) {
      const auto ul = static_cast<std::size_t>(l);
      const LayerGradients g = multi_head_attention_backward(
          view_of(xs[ul], {b, n, m.d}, "x"), layer_weights(m, ul), step_options(c, step, ul),
          view_of(dx, {b, n, m.d}, "dy"), std::nullopt, &states[ul]);
      const std::size_t base = 4 + 4 * ul;
      add_tensor(grads[base + 0], g.dwq);
      add_tensor(grads[base + 1], g.dwk);
      add_tensor(grads[base + 2], g.dwv);
      add_tensor(grads[base + 3], g.dwo);
      add_tensor(dx, g.dx);
    }
    for (std::size_t i = 0; i < batch.size(); ++i)
      embed_backward(batch[i], c.task.task, dx.data() + i * row, m.d, grads[0], grads[1]);
    for (std::size_t p = 0; p < params.size(); ++p)
      adam[p].update(*params[p], grads[p], c.adam, step);

    loss_since += loss;
    ++steps_since;
    result.loss = loss;
    if (step % c.eval_every == 0 || step == c.steps) {
      const auto now = std::chrono::steady_clock::now();
      CurvePoint point;
      point.step = step;
      point.loss = loss_since / steps_since;
      point.heldout_accuracy = evaluate(m, c, c.heldout);
      point.steps_per_second =
          steps_since / std::max(1e-9, std::chrono::duration<double>(now - last_point).count());
      result.curve.push_back(point);
      if (progress) progress(point);
      loss_since = 0.0;
      steps_since = 0;
      last_point = std::chrono::steady_clock::now();
    }
  }
  result.heldout_accuracy = result.curve.empty() ? evaluate(m, c, c.heldout)
                                                 : result.curve.back().heldout_accuracy;
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

std::vector<std::pair<std::string, Tensor>> model_tensors(const Model& m) {
  std::vector<std::pair<std::string, Tensor>> out;
  auto put = [&](std::string name, const std::vector<float>& v, Shape shape) {
    Tensor t(DType::kF32, std::move(shape), name);
    std::copy(v.begin(), v.end(), t.data_as<float>());
    out.emplace_back(std::move(name), std::move(t));
  };
  put("embed.a", m.table_a, {m.vocab_a, m.d});
  put("embed.b", m.table_b, {m.vocab_b, m.d});
  for (std::size_t l = 0; l < m.wq.size(); ++l) {
    const std::string p = "layer" + std::to_string(l) + ".";
    put(p + "wq", m.wq[l], {m.d, m.d});
    put(p + "wk", m.wk[l], {m.d, m.d});
    put(p + "wv", m.wv[l], {m.d, m.d});
    put(p + "wo", m.wo[l], {m.d, m.d});
  }
  put("readout.w", m.readout, {m.d, m.classes});
  put("readout.b", m.readout_bias, {m.classes});
  return out;
}

}  // namespace qkv::train
