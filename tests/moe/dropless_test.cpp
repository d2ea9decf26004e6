// Dropless experts, top-k for any k and balancing without an auxiliary loss (issue 14):
// top-3 routing and a routing bias on the hand-computed group of gating_test (gates from p
// alone, slots of choice j after those of choices < j); the dropless layer equals the capacity
// layer where nothing is dropped (values, gradients, counts); N ranks equal one rank under
// ZeRO stages 0 to 3 with top-1, 2 and 3; experts idle on some ranks (a bias keeps half of
// them empty, a rank without tokens) complete every stage with exact zero gradients there;
// the all-to-all bytes equal the layer's count; the bias update against the rule on loads
// summed by the test; errors for bad k, bias and layouts.
#include <doctest/doctest.h>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/moe/moe_layer.hpp"

TEST_SUITE_BEGIN("moe_dropless");
// One namespace per file: the files of this folder share one unity translation unit.
namespace dropless_tests {

namespace {
using namespace zest;
using namespace zest::testing;
namespace ad = zest::autodiff;

// ---------------------------------------------------------------------------------------
// Gating on gating_test's hand group (S = 6, E = 3), p by row:
//   token  p               by p     with bias (0, 0, .25): scores
//   0      .6  .3  .1      0 1 2    .6  .3  .35  -> 0
//   1      .5  .2  .3      0 2 1    .5  .2  .55  -> 2
//   2      .7  .1  .2      0 2 1    .7  .1  .45  -> 0
//   3      .2  .5  .3      1 2 0    .2  .5  .55  -> 2
//   4      .1  .4  .5      2 1 0    .1  .4  .75  -> 2
//   5      .3  .25 .45     2 0 1    .3  .25 .7   -> 2
// Top-3: every expert, gates p itself (renormalised over all three, which sum to 1). Slots:
// first choices 0 1 2 | 0 | 0 1 (counts 3 1 2); second: token 0 -> e1 slot 1, 1 -> e2 2,
// 2 -> e2 3, 3 -> e2 4, 4 -> e1 2, 5 -> e0 3; third: 0 -> e2 5, 1 -> e1 3, 2 -> e1 4,
// 3 -> e0 4, 4 -> e0 5, 5 -> e1 5.

using solo = local_mesh<"dp">;
using solo_logits = tensor<double, solo, "gse">;
const std::array<std::array<double, 3>, 6> hand_p{
    {{.6, .3, .1}, {.5, .2, .3}, {.7, .1, .2}, {.2, .5, .3}, {.1, .4, .5}, {.3, .25, .45}}};

struct choice {
  int expert, slot;
};

template <class R>
void check_choices(const R& r, const std::vector<std::vector<choice>>& want) {
  const auto experts = to_global(r.expert_index);
  const auto slots = to_global(r.slot_index);
  const auto weights = to_global(r.weight.value());
  const std::size_t k = want[0].size();
  REQUIRE(experts.size() == want.size() * k);
  for (std::size_t s = 0; s < want.size(); ++s) {
    for (std::size_t j = 0; j < k; ++j) {
      CAPTURE(s);
      CAPTURE(j);
      const choice c = want[s][j];
      CHECK(experts[s * k + j] == c.expert);
      CHECK(slots[s * k + j] == c.slot);
      double sum = 0;
      for (std::size_t i = 0; i < k; ++i)
        sum += hand_p[s][static_cast<std::size_t>(want[s][i].expert)];
      const double gate = hand_p[s][static_cast<std::size_t>(c.expert)] / (k == 1 ? 1.0 : sum);
      CHECK(weights[s * k + j] == doctest::Approx(c.slot < 0 ? 0.0 : gate).epsilon(1e-13));
    }
  }
}

template <class F>
void with_hand_logits(F&& f) {
  std::vector<double> x;
  for (const auto& row : hand_p)
    for (double p : row) x.push_back(std::log(p));
  const solo m;
  ad::tape t;
  auto logits = t.parameter(solo_logits::from_global(m, {1, 6, 3}, std::span<const double>(x)));
  f(t, logits);
}

// ---------------------------------------------------------------------------------------
// The layer on mesh<"dp", "ep">.

using mesh2 = mesh<"dp", "ep">;
using tokens = layout<split<'b', "dp", "ep">>;
template <class Mesh, int Stage>
using policy_of = training_policy<Mesh, zero_stage<Stage>>;

struct setup {
  std::size_t batch = 4, time = 8, width = 8, hidden = 12, experts = 4;
  moe::gating_options gating{.top_k = 2, .capacity_factor = 1.0, .seed = 11};
  bool biases = true;
  std::vector<double> routing_bias;  // set on the layer before the forward
};

struct layer_result {
  std::vector<double> y, dx;
  std::map<std::string, std::vector<double>> grads;
  std::vector<std::int64_t> routed, kept, dropped;  // per expert, summed over ranks
  std::uint64_t all_to_all_forward = 0, all_to_all_step = 0;
  moe::all_to_all_volume formula;
  std::vector<double> bias_after;
  std::vector<std::int64_t> load;  // update_routing_bias's
  // Every communicator's record after the whole step (forward, backward, optimizer, bias
  // update): comparable across runs on meshes made for them.
  std::vector<schedule_fingerprint> schedule;
};

template <class V>
std::vector<double> as_double(const V& v) {
  return std::vector<double>(v.begin(), v.end());
}

std::vector<std::int64_t> sum_over(std::vector<std::int64_t> v, MPI_Comm comm) {
  MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_INT64_T, MPI_SUM, comm);
  return v;
}

// One forward and backward, loss = sum(y * R) + 0.1 aux, then update_routing_bias.
template <int Stage, class Tokens = tokens>
layer_result run_layer(const mesh2& m, const setup& s, MPI_Comm comm) {
  using P = policy_of<mesh2, Stage>;
  using x_t = tensor<float, mesh2, "btm", Tokens>;
  using r_t = tensor<float, mesh2, "btm">;
  zero_engine<P> engine(m, {.seed = 5});
  const std::size_t group = engine.begin_group("moe");
  moe::moe_layer<P> layer(engine, "moe", s.width, s.hidden, s.experts, s.gating, true, s.biases);
  engine.end_group();
  if (!s.routing_bias.empty()) layer.set_routing_bias(s.routing_bias);
  const std::array<std::size_t, 3> xe{s.batch, s.time, s.width};
  const auto xg = global_values(xe, 1);
  const auto rg = global_values(xe, 2);
  const std::vector<float> xv(xg.begin(), xg.end()), rv(rg.begin(), rg.end());
  ad::tape t;
  auto x = t.parameter(x_t::from_global(m, xe, std::span<const float>(xv)));
  m.reset_stats();
  layer_result out;
  auto [y, loss] = [&] {
    auto in_scope = engine.use(t, group);
    auto y = layer(x);
    auto r = t.constant(r_t::from_global(m, xe, std::span<const float>(rv)));
    auto loss = ad::sum(y * r) + ad::scale(layer.aux_loss(), 0.1F);
    return std::pair{y, loss};
  }();
  out.all_to_all_forward = m.stats()[collective::all_to_all].bytes_sent;
  engine.backward(loss);
  out.all_to_all_step = m.stats()[collective::all_to_all].bytes_sent;
  out.formula = layer.last_all_to_all();
  out.y = as_double(to_global(y.value()));
  out.dx = as_double(to_global(x.grad()));
  out.grads["gate"] = as_double(to_global(layer.gate().gradient_buffer_tensor()));
  out.grads["in_weight"] = as_double(to_global(layer.in_weight().gradient_buffer_tensor()));
  out.grads["out_weight"] = as_double(to_global(layer.out_weight().gradient_buffer_tensor()));
  if (s.biases) {
    out.grads["in_bias"] = as_double(to_global(layer.in_bias().gradient_buffer_tensor()));
    out.grads["out_bias"] = as_double(to_global(layer.out_bias().gradient_buffer_tensor()));
  }
  out.routed = sum_over(layer.stats().routed_per_expert, comm);
  out.kept = sum_over(layer.stats().kept_per_expert, comm);
  out.dropped = sum_over(layer.stats().dropped_per_expert, comm);
  engine.step(0.0);  // the optimizer's collectives too, whatever the routing
  out.load = layer.update_routing_bias();
  out.bias_after = layer.routing_bias();
  out.schedule = schedule_of(m);
  return out;
}

double relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0, scale = 0;
  if (a.size() != b.size()) return 1e30;
  for (std::size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? worst / scale : (worst == 0 ? 0 : 1e30);
}

void check_same(const layer_result& a, const layer_result& b, double tolerance) {
  CHECK(relative(a.y, b.y) <= tolerance);
  CHECK(relative(a.dx, b.dx) <= tolerance);
  REQUIRE(a.grads.size() == b.grads.size());
  for (const auto& [name, g] : b.grads) {
    CAPTURE(name);
    CHECK(relative(a.grads.at(name), g) <= tolerance);
  }
  CHECK(a.routed == b.routed);
  CHECK(a.kept == b.kept);
  CHECK(a.dropped == b.dropped);
  CHECK(a.load == b.load);
  CHECK(a.bias_after == b.bias_after);
}

std::vector<mesh2> meshes() {
  std::vector<mesh2> out;
  for (const auto& sh : mesh_shapes())
    out.emplace_back(MPI_COMM_WORLD, std::array<int, 2>{sh[0], sh[1]});
  return out;
}

template <int Stage>
void check_against_one_rank(const setup& s) {
  const mesh2 one(MPI_COMM_SELF, std::array<int, 2>{1, 1});
  const layer_result want = run_layer<Stage>(one, s, MPI_COMM_SELF);
  for (const auto& m : meshes()) {
    CAPTURE(m.describe());
    const layer_result got = run_layer<Stage>(m, s, MPI_COMM_WORLD);
    check_same(got, want, 2e-6);
    CHECK(got.all_to_all_forward == got.formula.forward());
    CHECK(got.all_to_all_step == got.formula.step());
  }
}

// dropless_experts against the capacity path's pieces (dispatch_by_index, to_expert_layout,
// expert_feed_forward with biases, to_token_layout, combine_by_index) on the same routing
// without drops, in double, with every weight and bias non-zero: values and the gradients of
// x, the routing weight, both weights and both biases.
void check_op_against_capacity_pieces(const mesh2& m, int k) {
  using T = double;
  using x_t = tensor<T, mesh2, "gsm", layout<split<'g', "dp", "ep">>>;
  using l_t = tensor<T, mesh2, "gse", layout<split<'g', "dp", "ep">>>;
  using experts = layout<split<'e', "ep">>;
  const std::size_t G = 4, S = 6, M = 5, H = 7, E = 4;
  const auto param = [&]<class X>(std::array<std::size_t, X::rank> e, std::uint32_t salt,
                                  ad::tape& t) {
    const auto g = global_values(e, salt);
    return t.parameter(X::from_global(m, e, std::span<const T>(g)));
  };
  std::map<std::string, std::vector<double>> got[2];
  for (int path = 0; path < 2; ++path) {
    ad::tape t;
    auto x = param.template operator()<x_t>({G, S, M}, 3, t);
    auto logits = param.template operator()<l_t>({G, S, E}, 4, t);
    auto w_in = param.template operator()<tensor<T, mesh2, "emh", experts>>({E, M, H}, 5, t);
    auto b_in = param.template operator()<tensor<T, mesh2, "eh", experts>>({E, H}, 6, t);
    auto w_out = param.template operator()<tensor<T, mesh2, "ehm", experts>>({E, H, M}, 7, t);
    auto b_out = param.template operator()<tensor<T, mesh2, "em", experts>>({E, M}, 8, t);
    moe::gating_options o{
        .top_k = k, .dropless = path == 1, .random_routing = false, .one_hot = false};
    o.capacity_factor = static_cast<double>(E) / k;  // C = S: nothing dropped
    auto r = moe::gating(logits, o);
    REQUIRE(r.capacity == S);
    auto z = [&] {
      if (path == 1) {
        return moe::dropless_experts<"ep">(x, r.weight, r.expert_index, r.slot_index, w_in, b_in,
                                           w_out, b_out);
      }
      auto d = moe::dispatch_by_index(x, r.expert_index, r.slot_index, E, r.capacity);
      auto h = moe::expert_feed_forward(moe::to_expert_layout<"ep">(d), w_in, b_in, w_out, b_out);
      auto y = moe::to_token_layout<decltype(d)::tensor_type::layout>(h);
      return moe::combine_by_index(y, r.weight, r.expert_index, r.slot_index);
    }();
    const auto rg = global_values(std::array<std::size_t, 3>{G, S, M}, 9);
    auto loss = ad::sum(z * t.constant(x_t::from_global(m, {G, S, M}, std::span<const T>(rg))));
    ad::backward(loss);
    got[path]["z"] = to_global(z.value());
    got[path]["dx"] = to_global(x.grad());
    got[path]["dlogits"] = to_global(logits.grad());
    got[path]["dw_in"] = to_global(w_in.grad());
    got[path]["db_in"] = to_global(b_in.grad());
    got[path]["dw_out"] = to_global(w_out.grad());
    got[path]["db_out"] = to_global(b_out.grad());
  }
  for (const auto& [name, want] : got[0]) {
    CAPTURE(name);
    CHECK(relative(got[1].at(name), want) <= 1e-13);
  }
}

}  // namespace

TEST_CASE("dropless_experts equals dispatch, experts and combine by index (double, biases)") {
  for (const auto& m : meshes()) {
    CAPTURE(m.describe());
    for (int k : {1, 2, 3}) {
      CAPTURE(k);
      check_op_against_capacity_pieces(m, k);
    }
  }
}

TEST_CASE("gating: top-3 on the hand group, dropless and with capacity 3") {
  with_hand_logits([](ad::tape&, const auto& logits) {
    const std::vector<std::vector<choice>> all{{{0, 0}, {1, 1}, {2, 5}}, {{0, 1}, {2, 2}, {1, 3}},
                                               {{0, 2}, {2, 3}, {1, 4}}, {{1, 0}, {2, 4}, {0, 4}},
                                               {{2, 0}, {1, 2}, {0, 5}}, {{2, 1}, {0, 3}, {1, 5}}};
    const auto r = moe::gating(logits, {.top_k = 3, .dropless = true, .one_hot = false});
    CHECK(r.capacity == 6);
    check_choices(r, all);
    CHECK(r.stats.dropped == 0);
    CHECK(r.stats.routed_per_expert == std::vector<std::int64_t>{6, 6, 6});
    CHECK(r.stats.kept_per_expert == std::vector<std::int64_t>{6, 6, 6});
    CHECK(r.stats.tokens_per_expert == std::vector<std::int64_t>{3, 1, 2});
    // C = ceil(3 * 6 / 3 * 0.5) = 3: slots 3 and above dropped.
    auto capped = all;
    for (auto& row : capped)
      for (auto& c : row)
        if (c.slot >= 3) c.slot = -1;
    const auto rc = moe::gating(logits, {.top_k = 3, .capacity_factor = 0.5, .one_hot = false});
    CHECK(rc.capacity == 3);
    check_choices(rc, capped);
    CHECK(rc.stats.kept_per_expert == std::vector<std::int64_t>{3, 3, 3});
    CHECK(rc.stats.dropped_per_expert == std::vector<std::int64_t>{3, 3, 3});
    CHECK(rc.stats.dropped == 9);
  });
}

TEST_CASE("gating: the routing bias steers the choice, the gates stay p") {
  with_hand_logits([](ad::tape&, const auto& logits) {
    const std::vector<double> bias{0, 0, .25};
    moe::gating_options o{.top_k = 1, .capacity_factor = 2.0, .one_hot = false};
    o.routing_bias = bias;
    const auto r = moe::gating(logits, o);
    // C = ceil(6 / 3 * 2) = 4: expert 2's four tokens all fit.
    check_choices(r, {{{0, 0}}, {{2, 0}}, {{0, 1}}, {{2, 1}}, {{2, 2}}, {{2, 3}}});
    CHECK(r.stats.tokens_per_expert == std::vector<std::int64_t>{2, 0, 4});
    // Without the bias: by p.
    const auto plain = moe::gating(logits, {.top_k = 1, .capacity_factor = 2.0, .one_hot = false});
    check_choices(plain, {{{0, 0}}, {{0, 1}}, {{0, 2}}, {{1, 0}}, {{2, 0}}, {{2, 1}}});
  });
}

TEST_CASE("gating: bad k and bias are errors naming the operation") {
  with_hand_logits([](ad::tape&, const auto& logits) {
    CHECK_THROWS_WITH_AS(moe::gating(logits, {.top_k = 4}),
                         doctest::Contains("top-4 gating needs at least one group and token and 4"),
                         shape_error);
    CHECK_THROWS_WITH_AS(moe::gating(logits, {.top_k = 0}),
                         doctest::Contains("gating: options.top_k is 0"), shape_error);
    const std::vector<double> bias{0, 1};
    moe::gating_options o{.top_k = 1};
    o.routing_bias = bias;
    CHECK_THROWS_WITH_AS(
        moe::gating(logits, o),
        doctest::Contains("routing_bias has 2 values, the logits \"gse\" have e = 3"), shape_error);
  });
}

TEST_CASE("dropless layer equals the capacity layer when nothing is dropped") {
  for (const auto& m : meshes()) {
    CAPTURE(m.describe());
    for (int k : {1, 2, 3}) {
      CAPTURE(k);
      setup s;
      s.gating.top_k = k;
      s.gating.capacity_factor = 4.0 / k;  // C = S: nothing can drop
      const layer_result capacity = run_layer<0>(m, s, MPI_COMM_WORLD);
      s.gating.dropless = true;
      const layer_result dropless = run_layer<0>(m, s, MPI_COMM_WORLD);
      CHECK(capacity.dropped == std::vector<std::int64_t>(4, 0));
      check_same(dropless, capacity, 1e-6);
      // The dropless all-to-alls send only routed rows (and the counts).
      CHECK(dropless.all_to_all_step <= capacity.all_to_all_step);
    }
  }
}

TEST_CASE("dropless layer: N ranks equal one rank, ZeRO 0 to 3, top-1, 2 and 3") {
  setup s;
  s.gating.dropless = true;
  SUBCASE("top-2 with random routing, ZeRO 0 and 3") {
    check_against_one_rank<0>(s);
    check_against_one_rank<3>(s);
  }
  SUBCASE("top-1, uneven groups (a rank may hold none), no biases, ZeRO 1") {
    s.batch = 3;
    s.gating.top_k = 1;
    s.biases = false;
    check_against_one_rank<1>(s);
  }
  SUBCASE("top-3, bias updates, ZeRO 2") {
    s.gating.top_k = 3;
    s.gating.bias_update_rate = 0.01;
    check_against_one_rank<2>(s);
  }
}

TEST_CASE("dropless layer: experts idle on some ranks, every ZeRO stage") {
  // A bias of -10 keeps experts 2 and 3 out of every top-2 (p <= 1): the ranks that hold them
  // receive no row; with 3 sequences some rank holds no token either.
  setup s;
  s.batch = 3;
  s.gating.dropless = true;
  s.gating.random_routing = false;
  s.routing_bias = {0, 0, -10, -10};
  const auto check_idle = [&s](const layer_result& r) {
    CHECK(r.routed[2] == 0);
    CHECK(r.routed[3] == 0);
    CHECK(r.routed[0] + r.routed[1] == static_cast<std::int64_t>(2 * s.batch * s.time));
    // Experts 2 and 3 are the second half of every expert tensor (e is the first dim).
    for (const auto& [name, g] : r.grads) {
      if (name == "gate") continue;
      CAPTURE(name);
      bool zero = true, some = false;
      for (std::size_t i = g.size() / 2; i < g.size(); ++i) zero = zero && g[i] == 0.0;
      for (std::size_t i = 0; i < g.size() / 2; ++i) some = some || g[i] != 0.0;
      CHECK(zero);
      CHECK(some);
    }
  };
  const mesh2 one(MPI_COMM_SELF, std::array<int, 2>{1, 1});
  const layer_result w0 = run_layer<0>(one, s, MPI_COMM_SELF);
  const layer_result w1 = run_layer<1>(one, s, MPI_COMM_SELF);
  const layer_result w2 = run_layer<2>(one, s, MPI_COMM_SELF);
  const layer_result w3 = run_layer<3>(one, s, MPI_COMM_SELF);
  check_idle(w0);
  for (const auto& m : meshes()) {
    CAPTURE(m.describe());
    const layer_result r0 = run_layer<0>(m, s, MPI_COMM_WORLD);
    const layer_result r1 = run_layer<1>(m, s, MPI_COMM_WORLD);
    const layer_result r2 = run_layer<2>(m, s, MPI_COMM_WORLD);
    const layer_result r3 = run_layer<3>(m, s, MPI_COMM_WORLD);
    check_idle(r0);
    check_same(r0, w0, 2e-6);
    check_same(r1, w1, 2e-6);
    check_same(r2, w2, 2e-6);
    check_same(r3, w3, 2e-6);
  }
}

// Every rank's (hash, calls) of every communicator, rank-major: rank r's at r * size.
std::vector<std::uint64_t> gathered(const std::vector<schedule_fingerprint>& mine) {
  std::vector<std::uint64_t> words;
  for (const auto& f : mine) {
    words.push_back(f.hash);
    words.push_back(f.calls);
  }
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  std::vector<std::uint64_t> all(words.size() * static_cast<std::size_t>(ranks));
  MPI_Allgather(words.data(), static_cast<int>(words.size()), MPI_UINT64_T, all.data(),
                static_cast<int>(words.size()), MPI_UINT64_T, MPI_COMM_WORLD);
  return all;
}

// Issue 24's routing invariance: the collectives a rank issues (kind, element type, counts
// but an all_to_all's, reduction; their number) do not depend on where the tokens go. For
// capacity and dropless layers under every ZeRO stage, on every mesh shape: routings that
// send every token to two experts (the other experts receive nothing anywhere, and on ep = 2
// the ranks that hold them send all their tokens away), and a batch that leaves some rank
// without a token, give every rank the same schedule as the others and as the balanced
// run's on a mesh made alike.
template <int Stage>
void check_routing_invariance(const std::array<int, 2>& shape, bool dropless) {
  setup balanced;
  balanced.gating.dropless = dropless;
  balanced.gating.random_routing = false;
  setup skewed = balanced;
  skewed.routing_bias = {10, 10, -10, -10};  // top-2 is experts 0 and 1, always
  setup one_expert = balanced;
  one_expert.gating.top_k = 1;
  one_expert.routing_bias = {-10, -10, -10, 10};  // every token to expert 3
  setup sparse = skewed;
  sparse.batch = 3;  // 3 sequences over up to 4 ranks: some rank holds no token
  setup sparse_balanced = balanced;
  sparse_balanced.batch = 3;
  const auto run = [&](const setup& s) {
    const mesh2 m(MPI_COMM_WORLD, shape);  // fresh communicators: records start empty
    const layer_result r = run_layer<Stage>(m, s, MPI_COMM_WORLD);
    return gathered(r.schedule);
  };
  const auto want = run(balanced);
  const std::size_t per_rank = (mesh2::axis_count + 1) * 2;  // (hash, calls) per communicator
  REQUIRE(want.size() % per_rank == 0);
  // Every rank the same as rank 0 in the balanced run...
  for (std::size_t at = per_rank; at < want.size(); ++at) CHECK(want[at] == want[at % per_rank]);
  // ...and every routing the same as it.
  CHECK(run(skewed) == want);
  setup top1 = balanced;
  top1.gating.top_k = 1;
  CHECK(run(one_expert) == run(top1));
  CHECK(run(sparse) == run(sparse_balanced));
}

TEST_CASE("schedule: every rank's collectives the same, whatever the routing (ZeRO 0-3)") {
  for (const auto& shape : mesh_shapes()) {
    CAPTURE(shape);
    for (bool dropless : {false, true}) {
      CAPTURE(dropless);
      check_routing_invariance<0>({shape[0], shape[1]}, dropless);
      check_routing_invariance<1>({shape[0], shape[1]}, dropless);
      check_routing_invariance<2>({shape[0], shape[1]}, dropless);
      check_routing_invariance<3>({shape[0], shape[1]}, dropless);
    }
  }
}

TEST_CASE("update_routing_bias: rate * sign(mean load - load), the load over all ranks") {
  for (const auto& m : meshes()) {
    CAPTURE(m.describe());
    setup s;
    s.gating.dropless = true;
    s.gating.bias_update_rate = 0.125;
    s.gating.random_routing = false;
    s.routing_bias = {0.5, 0, 0, -0.25};
    const layer_result r = run_layer<0>(m, s, MPI_COMM_WORLD);
    REQUIRE(r.load.size() == 4);
    CHECK(r.load == r.routed);  // the routed choices, summed by the test with MPI
    std::int64_t total = 0;
    for (auto v : r.routed) total += v;
    CHECK(total == static_cast<std::int64_t>(2 * s.batch * s.time));
    for (std::size_t e = 0; e < 4; ++e) {
      CAPTURE(e);
      const double gap = static_cast<double>(total) / 4 - static_cast<double>(r.routed[e]);
      const double step = gap > 0 ? 0.125 : gap < 0 ? -0.125 : 0.0;
      CHECK(r.bias_after[e] == s.routing_bias[e] + step);
    }
  }
}

TEST_CASE("dropless_experts: tokens replicated over an expert axis of size > 1 are refused") {
  for (const auto& m : meshes()) {
    CAPTURE(m.describe());
    setup s;
    s.gating.dropless = true;
    if (m.size(1) > 1) {
      CHECK_THROWS_WITH_AS((run_layer<0, layout<split<'b', "dp">>>(m, s, MPI_COMM_WORLD)),
                           doctest::Contains("dropless_experts: the tokens \"gsm\" are replicated "
                                             "over the expert axis 'ep'"),
                           shape_error);
    } else {
      const mesh2 one(MPI_COMM_SELF, std::array<int, 2>{1, 1});
      check_same(run_layer<0, layout<split<'b', "dp">>>(m, s, MPI_COMM_WORLD),
                 run_layer<0, layout<split<'b', "dp">>>(one, s, MPI_COMM_SELF), 2e-6);
    }
  }
}

}  // namespace dropless_tests

TEST_SUITE_END();
