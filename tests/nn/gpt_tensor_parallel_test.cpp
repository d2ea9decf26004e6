// zest::gpt on mesh<"dp", "tp">: Megatron's tensor parallelism (heads, the MLP's hidden dim,
// the vocabulary split over tp) with and without sequence parallelism, under ZeRO-3 over dp
// (FSDP + TP), on every dp x tp shape of the world:
//   - N ranks train like one rank: 20 steps, losses within 1e-5 relative, same parameters;
//   - the bytes tp moves per step equal the closed formula (Megatron's 4 all-reduces of
//     b s h per layer, or as many all-gathers and reduce-scatters with sequence parallelism,
//     and the vocabulary-parallel loss's b s values), and the two schemes move the same;
//   - each rank holds 1/tp of the logits, never the whole vocabulary;
//   - DeepSpeed-Ulysses on mesh<"dp", "tp", "sp">: the sequence split over sp (and tp
//     inside it), the attention's q, k, v and output moved by all-to-alls between the
//     sequence and the heads: one rank's losses and parameters, and the all-to-all bytes;
//   - the collectives of a step do not depend on the tokens (issue 24): padding-only and
//     one-id batches give every rank the corpus's schedule.
#include <doctest/doctest.h>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "support/fixtures.hpp"
#include "train/training_fixture.hpp"
#include "zest/layout/layout_of.hpp"
#include "zest/nn/gpt.hpp"
#include "zest/zero/cost_model.hpp"

TEST_SUITE_BEGIN("nn_gpt_tensor_parallel");
// One namespace per file: the files of this folder share one unity translation unit.
namespace gpt_tensor_parallel_tests {

namespace {
using namespace zest;
using namespace zest::testing;

using tp_mesh = mesh<"dp", "tp">;
using policy = training_policy<tp_mesh, zero_stage<3>, float>;
using tensor_parallel = layout<split<'b', "dp">>;                      // the stream whole on tp
using sequence_parallel = layout<split<'b', "dp">, split<'t', "tp">>;  // and split on t there

template <class Tokens>
void check_like_one_rank(const std::array<int, 2>& shape) {
  const tp_mesh mesh(MPI_COMM_WORLD, shape);
  CAPTURE(mesh.describe());
  zero_engine<policy> engine(mesh, {.seed = 5});
  const gpt<policy> model(engine, small_gpt());
  const auto losses = train_steps<Tokens>(engine, model, 0, 20);
  const auto params = parameter_values(engine);

  const auto one = make_single_mesh<tp_mesh>();
  zero_engine<policy> ref_engine(one, {.seed = 5});
  const gpt<policy> ref_model(ref_engine, small_gpt());
  const auto ref_losses = train_steps<Tokens>(ref_engine, ref_model, 0, 20);
  const auto ref_params = parameter_values(ref_engine);

  check_same_losses(losses, ref_losses);
  CHECK(losses.back() < losses.front() - 0.3);
  check_same_parameters(params, ref_params);
}

TEST_CASE("gpt, tensor parallel: N ranks train like one rank") {
  for (const auto& shape : mesh_shapes()) check_like_one_rank<tensor_parallel>(shape);
}
TEST_CASE("gpt, tensor and sequence parallel: N ranks train like one rank") {
  for (const auto& shape : mesh_shapes()) check_like_one_rank<sequence_parallel>(shape);
}

// The axes' roles come from the policy, not from their names: the same model on
// mesh<"data", "model"> with axis_roles<"model", "", ""> trains exactly as on mesh<"dp", "tp">,
// holds the same blocks of every parameter, and moves the same bytes over "model" as over "tp".
TEST_CASE("gpt, tensor parallel over an axis the policy names: like \"tp\" by convention") {
  using named_mesh = mesh<"data", "model">;
  using named =
      training_policy<named_mesh, zero_stage<3, "data">, float, axis_roles<"model", "", "">>;
  using unnamed = training_policy<named_mesh, zero_stage<3, "data">, float, axis_roles<"", "", "">>;
  static_assert(named::tensor_axis == 1 && !named::has_sequence_axis && !named::has_expert_axis);
  static_assert(!unnamed::has_tensor_axis && policy::tensor_axis == 1);
  using tokens = layout<split<'b', "data">>;
  for (const auto& shape : mesh_shapes()) {
    const tp_mesh conventional_mesh(MPI_COMM_WORLD, shape);
    const named_mesh mesh(MPI_COMM_WORLD, shape);
    CAPTURE(mesh.describe());
    zero_engine<policy> conventional_engine(conventional_mesh, {.seed = 5});
    const gpt<policy> conventional_model(conventional_engine, small_gpt());
    const auto tp_before = conventional_mesh.axis(1).stats();
    const auto conventional =
        train_steps<tensor_parallel>(conventional_engine, conventional_model, 0, 6);
    const auto tp_bytes = (conventional_mesh.axis(1).stats() - tp_before).bytes_sent();

    zero_engine<named> engine(mesh, {.seed = 5});
    const gpt<named> model(engine, small_gpt());
    const auto model_before = mesh.axis(1).stats();
    const auto losses = train_steps<tokens>(engine, model, 0, 6);
    CHECK((mesh.axis(1).stats() - model_before).bytes_sent() == tp_bytes);
    check_same_losses(losses, conventional);
    check_same_parameters(parameter_values(engine), parameter_values(conventional_engine));
    const auto ours = engine.parameters();
    const auto theirs = conventional_engine.parameters();
    REQUIRE(ours.size() == theirs.size());
    for (std::size_t k = 0; k < ours.size(); ++k) {
      CAPTURE(ours[k]->name());
      CHECK(ours[k]->compute_elements() == theirs[k]->compute_elements());
    }
    if (shape[1] > 1) CHECK(tp_bytes > 0);
  }
}

// The bytes of one step per mesh axis, by collective.
template <class Tokens>
comm_stats tp_traffic(const tp_mesh& mesh) {
  zero_engine<policy> engine(mesh, {.seed = 5});
  const gpt<policy> model(engine, small_gpt());
  auto s = sampler();
  const auto [in, tg] = s.template batch<Tokens>(mesh, 0);
  const auto before = mesh.axis(1).stats();
  (void)train_step(engine, model, in, tg, 1e-3);
  return mesh.axis(1).stats() - before;
}

// gpt_shape: the model's parameter list from its options alone (what train_gpt plans before
// it builds anything) equals what the model registers: on one rank its names and extents,
// and with the world as tp (heads, vocabulary and hidden width not dividing by 4) the
// elements of each block rank 0 holds, the largest of any rank's.
TEST_CASE("gpt_shape: the parameters the model registers, and rank 0's blocks over tp") {
  gpt_options o = small_gpt();
  const auto one = make_single_mesh<tp_mesh>();
  {
    zero_engine<policy> engine(one, {.seed = 1});
    const gpt<policy> model(engine, o);
    const model_shape built = model.shape(), listed = gpt_shape(o);
    REQUIRE(built.parameters.size() == listed.parameters.size());
    for (std::size_t i = 0; i < built.parameters.size(); ++i) {
      CAPTURE(built.parameters[i].name);
      CHECK(listed.parameters[i].name == built.parameters[i].name);
      CHECK(listed.parameters[i].extents == built.parameters[i].extents);
    }
  }
  o.width = 42;
  o.heads = 6;      // 2, 2, 1, 1 heads over 4 ranks; 3, 3 over 2
  o.vocab = 91;     // 23, 23, 23, 22 rows; 46, 45
  o.mlp_ratio = 3;  // hidden 126: 32, 32, 31, 31; 63, 63
  const tp_mesh mesh(MPI_COMM_WORLD, {1, -1});
  const auto tp = static_cast<std::size_t>(mesh.size(1));
  zero_engine<policy> engine(mesh, {.seed = 1});
  const gpt<policy> model(engine, o);
  const model_shape listed = gpt_shape(o, tp);
  const auto& held = engine.parameters();
  REQUIRE(held.size() == listed.parameters.size());
  for (std::size_t i = 0; i < held.size(); ++i) {
    CAPTURE(held[i]->name());
    CHECK(listed.parameters[i].name == held[i]->name());
    const std::size_t here = held[i]->stored_elements();  // dp = 1: the whole tp block
    if (mesh.rank() == 0) CHECK(here == listed.parameters[i].elements());
    CHECK(here <= listed.parameters[i].elements());
  }
  CHECK_THROWS_AS(gpt_shape(o, 0), shape_error);
  o.heads = 5;  // 42 is not a multiple of 5
  CHECK_THROWS_AS(gpt_shape(o, tp), shape_error);
}

// Per rank and step, with P = tp, A = b s h of this dp rank's batch, R = b s its rows,
// L layers, and the ring model's counts (communicator.hpp; every size here divides by P):
//   TP   all-reduces: (4L + 2) A (attention's and the MLP's output forward, their input
//        gradients into the norms backward; the embedding's pending rows, the head's input
//        gradient), 3 R (the loss's row maxima, sums and target logits), the gradients of
//        the weights replicated over tp (norms, the row-parallel layers' biases, positions),
//        and the loss's gradient (one value)
//   SP   the activations' all-reduces become all-gathers and reduce-scatters of the same
//        (4L + 2) A: the same bytes; all-gathers of the ids and targets (int32, R each) and
//        of the position table's gradient (c h: its t-split gradient made whole); the rest
//        as TP.
TEST_CASE("gpt, tensor parallel: bytes over tp per step equal the formula, SP the same") {
  const gpt_options o = small_gpt();
  for (const auto& shape : mesh_shapes()) {
    const tp_mesh mesh(MPI_COMM_WORLD, shape);
    CAPTURE(mesh.describe());
    const auto tp = tp_traffic<tensor_parallel>(mesh);
    const auto sp = tp_traffic<sequence_parallel>(mesh);
    const auto P = static_cast<std::uint64_t>(shape[1]);
    const auto me = static_cast<std::size_t>(mesh.coord(1));
    const std::uint64_t rows = small_batch / static_cast<std::uint64_t>(shape[0]) * o.context;
    const std::uint64_t A = rows * o.width, L = o.layers;
    const std::uint64_t replicated = o.context * o.width + 6 * o.width * L + 2 * o.width;
    const std::uint64_t scalar = 2 * (1 - balanced_block(1, P, me).size) * sizeof(float);
    const auto all_reduce = [&](std::uint64_t n) { return 2 * n * (P - 1) / P * sizeof(float); };
    const auto gathered = [&](std::uint64_t n) { return n * (P - 1) / P * sizeof(float); };
    CHECK(tp[collective::all_reduce].bytes_sent ==
          all_reduce((4 * L + 2) * A + 3 * rows + replicated) + scalar);
    CHECK(tp[collective::all_gather].bytes_sent == 0);
    CHECK(tp[collective::reduce_scatter].bytes_sent == 0);
    CHECK(sp[collective::all_reduce].bytes_sent == all_reduce(3 * rows + replicated) + scalar);
    CHECK(sp[collective::reduce_scatter].bytes_sent == gathered((4 * L + 2) * A));
    CHECK(sp[collective::all_gather].bytes_sent ==
          gathered((4 * L + 2) * A + o.context * o.width) + gathered(2 * rows));
    // The planner's step model (zest/zero/cost_model.hpp) prices the same collectives: its
    // figure is this rank's bytes but for the loss's one-value gradient.
    transformer_config c = gpt_transformer("small", L, o.width, o.heads, o.vocab, o.context);
    c.tied_output = false;
    c.dropout = false;
    parallel_layout pl{.dp = shape[0], .tp = shape[1], .zero_stage = 3};
    pl.micro_batch = small_batch / static_cast<std::size_t>(shape[0]);
    const double plan_tp = estimate_step(c, pl, cluster{}, fp32_adam).tensor.bytes_sent;
    pl.sequence_parallel = P > 1;
    const double plan_sp = estimate_step(c, pl, cluster{}, fp32_adam).tensor.bytes_sent;
    CHECK(static_cast<double>(tp.bytes_sent() - scalar) == plan_tp);
    if (P > 1) CHECK(static_cast<double>(sp.bytes_sent() - scalar) == plan_sp);
    // The activations: the same bytes either way.
    CHECK(sp[collective::all_gather].bytes_sent + sp[collective::reduce_scatter].bytes_sent -
              gathered(o.context * o.width + 2 * rows) ==
          all_reduce((4 * L + 2) * A));
  }
}

// The logits of a tensor-parallel model: each rank holds its block of the vocabulary.
TEST_CASE("gpt, tensor parallel: the logits stay split over the vocabulary") {
  for (const auto& shape : mesh_shapes()) {
    const tp_mesh mesh(MPI_COMM_WORLD, shape);
    zero_engine<policy> engine(mesh, {.seed = 5});
    const gpt<policy> model(engine, small_gpt());
    auto s = sampler();
    const auto [in, tg] = s.template batch<sequence_parallel>(mesh, 0);
    autodiff::tape t;
    const auto logits = model.logits(t, in);
    using logits_t = typename std::remove_cvref_t<decltype(logits)>::tensor_type;
    static_assert(layout_is<logits_t, layout<split<'b', "dp">, split<'v', "tp">>>);
    CHECK(logits.value().local_extents()[2] ==
          balanced_block(small_gpt().vocab, static_cast<std::size_t>(shape[1]),
                         static_cast<std::size_t>(mesh.coord(1)))
              .size);
  }
}

// Ulysses, alone and with tensor parallelism: the world as dp x tp x sp.
using ulysses_mesh = mesh<"dp", "tp", "sp">;
using ulysses_policy = training_policy<ulysses_mesh, zero_stage<3>, float>;
using ulysses_tokens = layout<split<'b', "dp">, split<'t', "sp", "tp">>;

std::vector<std::array<int, 3>> ulysses_shapes() {
  const int n = world_size();
  if (n == 1) return {{1, 1, 1}};
  if (n == 2) return {{1, 1, 2}};
  return {{1, 1, 4}, {2, 1, 2}, {1, 2, 2}};
}

TEST_CASE("gpt, Ulysses sequence parallel (with and without tp): N ranks train like one rank") {
  for (const auto& shape : ulysses_shapes()) {
    const ulysses_mesh mesh(MPI_COMM_WORLD, shape);
    CAPTURE(mesh.describe());
    zero_engine<ulysses_policy> engine(mesh, {.seed = 5});
    const gpt<ulysses_policy> model(engine, small_gpt());
    const auto sp_before = mesh.axis(2).stats();
    const auto losses = train_steps<ulysses_tokens>(engine, model, 0, 20);
    const auto sp = mesh.axis(2).stats() - sp_before;
    const auto params = parameter_values(engine);

    const auto one = make_single_mesh<ulysses_mesh>();
    zero_engine<ulysses_policy> ref_engine(one, {.seed = 5});
    const gpt<ulysses_policy> ref_model(ref_engine, small_gpt());
    const auto ref_losses = train_steps<ulysses_tokens>(ref_engine, ref_model, 0, 20);
    const auto ref_params = parameter_values(ref_engine);
    for (std::size_t k = 0; k < losses.size(); ++k) {
      INFO("step " << k << ": " << losses[k] << " vs " << ref_losses[k]);
      CHECK(std::abs(losses[k] - ref_losses[k]) <= 1e-5 * std::abs(ref_losses[k]));
    }
    for (const auto& [name, values] : params) {
      const auto& ref = ref_params.at(name);
      double worst = 0;
      for (std::size_t i = 0; i < values.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::abs(values[i] - ref[i])));
      INFO("parameter " << name << ": largest difference " << worst);
      CHECK(worst <= 1e-5);
    }
    // Without tp: per layer and step 8 all-to-alls (q, k, v and the output, forward and
    // backward) of this rank's b s h / P, each sending (P - 1)/P of it.
    if (shape[1] == 1) {
      const gpt_options o = small_gpt();
      const auto P = static_cast<std::uint64_t>(shape[2]);
      const std::uint64_t A =
          small_batch / static_cast<std::uint64_t>(shape[0]) * o.context * o.width;
      CHECK(sp[collective::all_to_all].bytes_sent ==
            20 * 8 * o.layers * (A / P) * (P - 1) / P * sizeof(float));
    }
  }
}

// Issue 24's data invariance for the dense layers: the collectives of three training steps
// (forward, backward, ZeRO-3's gathers and reductions, the optimizer), as every
// communicator's schedule_fingerprint, on a mesh made for the run; every rank's, rank-major.
template <class Policy, class Tokens, class Mesh = typename Policy::mesh_type>
std::vector<std::uint64_t> step_schedule(const std::array<int, Mesh::axis_count>& shape,
                                         std::span<const std::int32_t> text) {
  const Mesh mesh(MPI_COMM_WORLD, shape);
  zero_engine<Policy> engine(mesh, {.seed = 5});
  const gpt<Policy> model(engine, small_gpt());
  batch_sampler s(text, small_batch, small_gpt().context, 7);
  for (std::size_t k = 0; k < 3; ++k) {
    const auto [in, tg] = s.template batch<Tokens>(mesh, k);
    (void)train_step(engine, model, in, tg, learning_rate(static_cast<std::int64_t>(k)), k);
  }
  std::vector<std::uint64_t> mine;
  for (const auto& f : schedule_of(mesh)) {
    mine.push_back(f.hash);
    mine.push_back(f.calls);
  }
  std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(world_size()));
  MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_UINT64_T, all.data(),
                static_cast<int>(mine.size()), MPI_UINT64_T, MPI_COMM_WORLD);
  for (std::size_t at = mine.size(); at < all.size(); ++at) CHECK(all[at] == all[at % mine.size()]);
  return all;
}

// The corpus's batches against batches of one token (a padding-only text: every position
// the same id, the last of the vocabulary) and of the first id: tensor parallel, sequence
// parallel and Ulysses, each rank the same as the others and as the corpus's run.
TEST_CASE("gpt, tp, sp and Ulysses: every rank's collectives the same, whatever the tokens") {
  const std::vector<std::int32_t> padding(512, static_cast<std::int32_t>(small_gpt().vocab - 1));
  const std::vector<std::int32_t> first(512, 0);
  for (const auto& shape : mesh_shapes()) {
    CAPTURE(shape);
    const auto tp = step_schedule<policy, tensor_parallel>(shape, corpus().train());
    CHECK(step_schedule<policy, tensor_parallel>(shape, padding) == tp);
    CHECK(step_schedule<policy, tensor_parallel>(shape, first) == tp);
    const auto sp = step_schedule<policy, sequence_parallel>(shape, corpus().train());
    CHECK(step_schedule<policy, sequence_parallel>(shape, padding) == sp);
  }
  for (const auto& shape : ulysses_shapes()) {
    CAPTURE(shape);
    const auto u = step_schedule<ulysses_policy, ulysses_tokens>(shape, corpus().train());
    CHECK(step_schedule<ulysses_policy, ulysses_tokens>(shape, padding) == u);
  }
}

}  // namespace

}  // namespace gpt_tensor_parallel_tests

TEST_SUITE_END();
