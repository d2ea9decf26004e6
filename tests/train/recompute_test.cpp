// Activation recomputation (zest/autodiff/checkpoint.hpp, zero_options::recompute), against the
// run without it as the reference:
//   - autodiff::checkpoint: the same gradients bit for bit (einsum, gelu, dropout), the
//     function's internals freed after forward (measured by zest's accounting), the errors
//     (the determinism check on the emulated backend too, which takes a GPU's path);
//   - the GPT and the Llama-style decoder (dropout 0.1, so every mask is drawn twice), every
//     ZeRO stage: 20 steps under none, selective and full give the same losses and parameters
//     exactly; the bytes per step are the ZeRO formula's (3 Psi (N-1)/N under stage 3: the
//     recomputation uses the backward gather) and those of the run without; the peak bytes
//     of a step are lower by at least the tensors the mode drops.
// Registered at 1 and 2 ranks.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "llama.hpp"
#include "train/training_fixture.hpp"
#include "zest/autodiff/checkpoint.hpp"
#include "zest/mesh/emulated_mesh.hpp"
#include "zest/zero/planner.hpp"

TEST_SUITE_BEGIN("train_recompute");
// One namespace per file: the files of this folder share one unity translation unit.
namespace recompute_tests {

namespace {
using namespace zest;
using namespace zest::testing;
namespace ad = zest::autodiff;

// ----- the mechanism ---------------------------------------------------------------------

using x_t = tensor<float, world_mesh, "btm", layout<split<'b', "dp">>>;
using w_t = tensor<float, world_mesh, "mh", layout<>>;
constexpr std::size_t B = 4, T = 8, M = 6, H = 64;

struct function_run {
  host_vector<float> loss, dx, dw;
  std::int64_t kept_bytes = 0;  // live after forward, beyond the inputs
};

// loss = sum(dropout(gelu(x w) * (x w)) v), the middle part checkpointed or not; `nested`:
// gelu(u) * u checkpointed again inside it.
function_run run_function(const world_mesh& mesh, bool recompute, bool nested = false) {
  const auto xv = x_t::generate(
      mesh, {B, T, M}, [](const auto& i) { return static_cast<float>(value_at(i, 1) * 0.1); });
  const auto wv = w_t::generate(
      mesh, {M, H}, [](const auto& i) { return static_cast<float>(value_at(i, 2) * 0.1); });
  const auto vv = w_t::generate(
      mesh, {M, H}, [](const auto& i) { return static_cast<float>(value_at(i, 3) * 0.05); });
  ad::tape t;
  auto x = t.parameter(x_t(xv));
  auto w = t.parameter(w_t(wv));
  auto v = t.constant(w_t(vv));
  const std::int64_t before = memory::live_bytes();
  auto body = [w, nested](const ad::variable<x_t>& in) {
    auto u = ad::einsum<"btm,mh->bth">(in, w);
    auto g = ad::checkpoint_if(
        nested, [](const auto& a) { return ad::gelu(a) * a; }, u);
    return ad::dropout(g, 0.25, 99);
  };
  auto y = ad::checkpoint_if(recompute, body, x);
  function_run r;
  r.kept_bytes = memory::live_bytes() - before;
  auto loss = ad::sum(ad::einsum<"bth,mh->btm">(y, v) * x);
  ad::backward(loss);
  r.loss = loss.value().local_to_host();
  r.dx = x.grad().local_to_host();
  r.dw = w.grad().local_to_host();
  return r;
}

TEST_CASE("checkpoint: the same gradients bit for bit, the internals freed after forward") {
  const auto mesh = make_world_mesh();
  const auto plain = run_function(mesh, false);
  const auto recomputed = run_function(mesh, true);
  CHECK(recomputed.loss == plain.loss);
  CHECK(recomputed.dx == plain.dx);
  CHECK(recomputed.dw == plain.dw);
  const auto nested = run_function(mesh, true, true);  // rebuilt twice: outer, then inner
  CHECK(nested.loss == plain.loss);
  CHECK(nested.dx == plain.dx);
  CHECK(nested.dw == plain.dw);
  // Dropped: u, gelu(u), their product (b t h floats each); the output stays.
  const auto local_b = static_cast<std::int64_t>(B / static_cast<std::size_t>(mesh.world_size()));
  const std::int64_t bth = local_b * static_cast<std::int64_t>(T * H * sizeof(float));
  INFO("kept after forward: " << plain.kept_bytes << " bytes without, " << recomputed.kept_bytes
                              << " with recomputation");
  CHECK(plain.kept_bytes - recomputed.kept_bytes >= 3 * bth);
  CHECK(recomputed.kept_bytes <= 2 * bth);  // the output (and what the tape holds of it)
}

TEST_CASE("checkpoint: bad input is a clear error") {
  const auto mesh = make_world_mesh();
  const auto xv =
      x_t::generate(mesh, {B, T, M}, [](const auto& i) { return static_cast<float>(i[2]); });
  const auto wv = w_t::generate(mesh, {M, H}, [](const auto& i) { return 0.01F * i[1]; });

  SUBCASE("a variable made inside and used outside") {
    ad::tape t;
    auto x = t.parameter(x_t(xv));
    auto w = t.parameter(w_t(wv));
    std::optional<ad::variable<tensor<float, world_mesh, "bth", layout<split<'b', "dp">>>>> kept;
    auto y = ad::checkpoint(
        [&](const ad::variable<x_t>& in) {
          auto u = ad::einsum<"btm,mh->bth">(in, w);
          kept.emplace(u);
          return ad::gelu(u);
        },
        x);
    auto loss = ad::sum(y) + ad::sum(*kept);
    CHECK_THROWS_WITH_AS(ad::backward(loss),
                         doctest::Contains("received a gradient from outside it"),
                         std::logic_error);
  }
  SUBCASE("a function that is not deterministic") {
    ad::tape t;
    auto x = t.parameter(x_t(xv));
    std::uint64_t calls = 0;
    auto y = ad::checkpoint(
        [&calls](const ad::variable<x_t>& in) { return ad::dropout(in, 0.5, ++calls); }, x);
    CHECK_THROWS_WITH_AS(ad::backward(ad::sum(y)), doctest::Contains("not deterministic"),
                         std::logic_error);
  }
  SUBCASE("a function that is not deterministic, on the emulated backend (a GPU's check)") {
    using emulated = emulated_mesh<"dp">;
    using ex_t = tensor<float, emulated, "btm", layout<split<'b', "dp">>>;
    const emulated em(MPI_COMM_WORLD, {mesh.world_size()});
    const auto exv = ex_t::generate(em, {B, T, M}, [](const auto& i) { return 1.0F + i[2]; });
    for (const bool deterministic : {true, false}) {
      ad::tape t;
      auto x = t.parameter(ex_t(exv));
      std::uint64_t calls = 0;
      auto y = ad::checkpoint(
          [&](const ad::variable<ex_t>& in) {
            return ad::dropout(in, 0.5, deterministic ? std::uint64_t{7} : ++calls);
          },
          x);
      if (deterministic) {
        CHECK_NOTHROW(ad::backward(ad::sum(y)));
      } else {
        CHECK_THROWS_WITH_AS(ad::backward(ad::sum(y)), doctest::Contains("not deterministic"),
                             std::logic_error);
      }
    }
  }
  SUBCASE("inputs of two tapes") {
    ad::tape t1, t2;
    auto a = t1.parameter(x_t(xv));
    auto b = t2.parameter(x_t(xv));
    CHECK_THROWS_WITH_AS(ad::checkpoint([](const auto& p, const auto& q) { return p + q; }, a, b),
                         doctest::Contains("different tapes"), std::logic_error);
  }
  SUBCASE("a ZeRO group entered inside the function") {
    zero_engine<training_policy<world_mesh, zero_stage<3>, float>> engine(mesh, {});
    const std::size_t g = engine.begin_group("layer");
    parameter<training_policy<world_mesh, zero_stage<3>, float>, "mh"> w(engine, "w", {M, H},
                                                                         init::normal(0.02));
    engine.end_group();
    ad::tape t;
    auto x = t.parameter(x_t(xv));
    CHECK_THROWS_WITH_AS(ad::checkpoint(
                             [&](const ad::variable<x_t>& in) {
                               auto scope = engine.use(t, g);
                               return ad::einsum<"btm,mh->bth">(in, w.value());
                             },
                             x),
                         doctest::Contains("entered inside a checkpointed function"),
                         std::logic_error);
    engine.discard_forward();
  }
  SUBCASE("a word that is not a mode") {
    CHECK(parse_recomputation("selective") == recomputation::selective);
    CHECK_THROWS_WITH_AS((void)parse_recomputation("partial"),
                         "zest: recomputation 'partial': expected none, selective or full",
                         std::invalid_argument);
  }
}

// ----- the models --------------------------------------------------------------------------

gpt_options gpt_model() {
  gpt_options o = small_gpt();
  o.dropout = 0.1;
  return o;
}
llama_example::llama_options llama_model() {
  llama_example::llama_options o;
  o.vocab = 96;
  o.context = small_gpt().context;
  o.width = 32;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.hidden = 48;
  o.dropout = 0.1;
  return o;
}

struct model_run {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
  std::uint64_t bytes_sent = 0, all_gather_calls = 0;  // of the first step
  std::int64_t peak = 0;                               // of the first step, above the states
  std::uint64_t planned_bytes = 0;                     // the ZeRO planner's, for this model
  bool even = true;  // every parameter's first dim (the one ZeRO splits) divides by the ranks
};

template <class P, class Model, class Options>
model_run run_model(const world_mesh& mesh, const Options& options, recomputation mode,
                    std::int64_t steps) {
  zero_options zo;
  zo.seed = 21;
  zo.recompute = mode;
  zero_engine<P> engine(mesh, zo);
  const std::int64_t before = memory::live_bytes();
  Model model(engine, options);
  const std::int64_t states = memory::live_bytes() - before;
  model_run r;
  auto s = sampler();
  for (std::int64_t k = 0; k < steps; ++k) {
    const auto [in, tg] = s.batch<"dp">(mesh, static_cast<std::size_t>(k));
    const auto step =
        train_step(engine, model, in, tg, learning_rate(k), static_cast<std::uint64_t>(k));
    r.losses.push_back(step.loss);
    if (k == 0) {
      r.bytes_sent = step.traffic.bytes_sent();
      r.all_gather_calls = step.traffic[collective::all_gather].calls;
      r.peak = step.peak_bytes - before - states;
    }
  }
  r.params = parameter_values(engine);
  r.planned_bytes = plan_zero<typename P::stage>(model.shape(), mesh, fp32_adam).bytes_sent();
  for (const auto* p : engine.parameters())
    r.even = r.even && p->global_extents()[0] % static_cast<std::size_t>(mesh.world_size()) == 0;
  return r;
}

template <int Stage, class Model, class Options>
void check_modes(const Options& options, const char* name, std::int64_t core_bytes,
                 std::int64_t token_bytes) {
  using P = training_policy<world_mesh, zero_stage<Stage>, float>;
  const auto mesh = make_world_mesh();
  const auto none = run_model<P, Model>(mesh, options, recomputation::none, 20);
  const auto selective = run_model<P, Model>(mesh, options, recomputation::selective, 20);
  const auto full = run_model<P, Model>(mesh, options, recomputation::full, 20);
  INFO(std::string(name) << ", stage " << Stage << ", " << mesh.world_size() << " ranks");
  CHECK(none.losses.back() < none.losses.front() - 0.3);  // it learns
  CHECK(selective.losses == none.losses);
  CHECK(full.losses == none.losses);
  CHECK(selective.params == none.params);
  CHECK(full.params == none.params);

  // The ZeRO table's bytes (tests/train/zero_stage_checks.hpp), unchanged by recomputation:
  // 2 Psi (N-1)/N elements (3 under stage 3) and the planner's figure where every parameter
  // splits evenly over the ranks (the GPT's always; the Llama decoder's [2, 2, 8, 32]
  // projection not over 4 ranks, where only the modes' equality is checked).
  std::uint64_t count = 0;  // Psi
  for (const auto& [n, v] : none.params) count += v.size();
  const auto ranks = static_cast<std::uint64_t>(mesh.world_size());
  const std::uint64_t formula =
      (Stage == 3 ? 3 : 2) * (count * (ranks - 1) / ranks) * sizeof(float);
  if (none.even) {
    CHECK(none.bytes_sent == formula);
    CHECK(none.bytes_sent == none.planned_bytes);
  }
  CHECK(selective.bytes_sent == none.bytes_sent);
  CHECK(full.bytes_sent == none.bytes_sent);
  CHECK(full.all_gather_calls == none.all_gather_calls);

  // Peak bytes of a step above the model states: selective drops the attention core of every
  // block but the one being rebuilt, full keeps a block's input only.
  MESSAGE(std::string(name) << " stage " << Stage << " ranks " << mesh.world_size()
                            << ": peak above states " << none.peak << " (none), " << selective.peak
                            << " (selective), " << full.peak << " (full)");
  // At the peak (backward's start) every block but one holds its two b n t s tensors (scores,
  // probabilities) under none, not under selective; under full every block but one drops at
  // least its q, k, v and output projection (b t m each) beside them.
  const std::int64_t layers = 2;
  CHECK(none.peak - selective.peak >= (layers - 1) * 2 * core_bytes);
  CHECK(selective.peak - full.peak >= (layers - 1) * 4 * token_bytes);
}

// One b n t s tensor of a block, and one b t m tensor (fp32, this rank's sequences).
std::int64_t scores_bytes(std::size_t heads) {
  const std::size_t b = small_batch / static_cast<std::size_t>(world_size());
  const std::size_t t = small_gpt().context;
  return static_cast<std::int64_t>(b * heads * t * t * sizeof(float));
}
std::int64_t token_bytes(std::size_t width) {
  const std::size_t b = small_batch / static_cast<std::size_t>(world_size());
  return static_cast<std::int64_t>(b * small_gpt().context * width * sizeof(float));
}

template <int Stage>
void check_both_models() {
  check_modes<Stage, gpt<training_policy<world_mesh, zero_stage<Stage>, float>>>(
      gpt_model(), "gpt", scores_bytes(gpt_model().heads), token_bytes(gpt_model().width));
  check_modes<Stage, llama_example::llama<training_policy<world_mesh, zero_stage<Stage>, float>>>(
      llama_model(), "llama", scores_bytes(llama_model().heads), token_bytes(llama_model().width));
}

TEST_CASE("recomputation: ZeRO stage 0, the same losses and parameters exactly") {
  check_both_models<0>();
}
TEST_CASE("recomputation: ZeRO stage 1, the same losses and parameters exactly") {
  check_both_models<1>();
}
TEST_CASE("recomputation: ZeRO stage 2, the same losses and parameters exactly") {
  check_both_models<2>();
}
TEST_CASE("recomputation: ZeRO stage 3, the same losses, parameters and bytes") {
  check_both_models<3>();
}

}  // namespace

// ----- with tensor and sequence parallelism ------------------------------------------------

namespace {
using tp_mesh = mesh<"dp", "tp">;
using tp_policy = training_policy<tp_mesh, zero_stage<3>, float>;

struct tp_run {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
  std::uint64_t dp_bytes = 0, tp_bytes = 0;  // of the first step
};

template <class Tokens>
tp_run run_tp(const tp_mesh& mesh, recomputation mode) {
  zero_options zo;
  zo.seed = 5;
  zo.recompute = mode;
  zero_engine<tp_policy> engine(mesh, zo);
  const gpt<tp_policy> model(engine, gpt_model());
  tp_run r;
  auto s = sampler();
  for (std::size_t k = 0; k < 20; ++k) {
    const auto [in, tg] = s.template batch<Tokens>(mesh, k);
    const auto dp0 = mesh.axis(0).stats();
    const auto tp0 = mesh.axis(1).stats();
    r.losses.push_back(
        train_step(engine, model, in, tg, learning_rate(static_cast<std::int64_t>(k)), k).loss);
    if (k == 0) {
      r.dp_bytes = (mesh.axis(0).stats() - dp0).bytes_sent();
      r.tp_bytes = (mesh.axis(1).stats() - tp0).bytes_sent();
    }
  }
  r.params = parameter_values(engine);
  return r;
}

// Full recomputation repeats each block's forward collectives over tp in backward: 2 per layer
// of A = b s h elements (an all-reduce each, or an all-gather and a reduce-scatter under
// sequence parallelism: 2 (P-1)/P A either way); ZeRO's bytes over dp do not change.
template <class Tokens>
void check_tp_modes(const std::array<int, 2>& shape) {
  const tp_mesh mesh(MPI_COMM_WORLD, shape);
  CAPTURE(mesh.describe());
  const auto none = run_tp<Tokens>(mesh, recomputation::none);
  const auto selective = run_tp<Tokens>(mesh, recomputation::selective);
  const auto full = run_tp<Tokens>(mesh, recomputation::full);
  CHECK(selective.losses == none.losses);
  CHECK(full.losses == none.losses);
  CHECK(selective.params == none.params);
  CHECK(full.params == none.params);
  CHECK(selective.dp_bytes == none.dp_bytes);
  CHECK(full.dp_bytes == none.dp_bytes);
  CHECK(selective.tp_bytes == none.tp_bytes);  // the core is local: heads split over tp
  const auto p = static_cast<std::uint64_t>(shape[1]);
  const std::uint64_t a =
      small_batch / static_cast<std::uint64_t>(shape[0]) * small_gpt().context * small_gpt().width;
  const std::uint64_t layers = small_gpt().layers;
  CHECK(full.tp_bytes - none.tp_bytes == layers * 2 * (2 * (p - 1) * a / p) * sizeof(float));
}
}  // namespace

TEST_CASE("recomputation with tensor parallelism (ZeRO-3 x TP): the same numbers, the bytes") {
  for (const auto& shape : mesh_shapes()) {
    check_tp_modes<layout<split<'b', "dp">>>(shape);
    check_tp_modes<layout<split<'b', "dp">, split<'t', "tp">>>(shape);
  }
}

}  // namespace recompute_tests

TEST_SUITE_END();
