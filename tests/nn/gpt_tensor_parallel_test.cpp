// zest::gpt on mesh<"dp", "tp">: Megatron's tensor parallelism (heads, the MLP's hidden dim,
// the vocabulary split over tp) with and without sequence parallelism, under ZeRO-3 over dp
// (FSDP + TP), on every dp x tp shape of the world:
//   - N ranks train like one rank: 20 steps, losses within 1e-5 relative, same parameters;
//   - the bytes tp moves per step equal the closed formula (Megatron's 4 all-reduces of
//     b s h per layer, or as many all-gathers and reduce-scatters with sequence parallelism,
//     and the vocabulary-parallel loss's b s values), and the two schemes move the same;
//   - each rank holds 1/tp of the logits, never the whole vocabulary.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "support/fixtures.hpp"
#include "train/training_fixture.hpp"
#include "zest/nn/gpt.hpp"

namespace {
using namespace zest;
using namespace zest::testing;

using tp_mesh = mesh<"dp", "tp">;
using policy = training_policy<tp_mesh, zero_stage<3>, float>;
using tensor_parallel = layout<split<'b', "dp">>;                     // the stream whole on tp
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

  for (std::size_t k = 0; k < losses.size(); ++k) {
    INFO("step " << k << ": " << losses[k] << " vs " << ref_losses[k]);
    CHECK(std::abs(losses[k] - ref_losses[k]) <= 1e-5 * std::abs(ref_losses[k]));
  }
  CHECK(losses.back() < losses.front() - 0.3);
  for (const auto& [name, values] : params) {
    const auto& ref = ref_params.at(name);
    REQUIRE(values.size() == ref.size());
    double worst = 0;
    for (std::size_t i = 0; i < values.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(values[i] - ref[i])));
    INFO("parameter " << name << ": largest difference " << worst);
    CHECK(worst <= 1e-5);
  }
}

TEST_CASE("gpt, tensor parallel: N ranks train like one rank") {
  for (const auto& shape : mesh_shapes()) check_like_one_rank<tensor_parallel>(shape);
}
TEST_CASE("gpt, tensor and sequence parallel: N ranks train like one rank") {
  for (const auto& shape : mesh_shapes()) check_like_one_rank<sequence_parallel>(shape);
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

}  // namespace
