// Shared pieces of the training tests: a small GPT whose every parameter splits evenly over
// 1, 2 and 4 ranks (so the ZeRO table's closed forms hold exactly, docs/design-notes.md), a
// corpus, and runs.
#pragma once

#include <mpi.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/data/batches.hpp"
#include "zest/data/text_dataset.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/nn/gpt.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/train/train_step.hpp"

namespace zest::testing {

using world_mesh = zest::mesh<"dp">;

inline gpt_options small_gpt() {
  gpt_options o;
  o.vocab = 96;  // the corpus's 86 bytes, padded
  o.context = 16;
  o.width = 32;
  o.layers = 2;
  o.heads = 4;
  return o;
}
inline constexpr std::size_t small_batch = 8;

inline const text_dataset& corpus() {
  static const text_dataset d = text_dataset::from_path();
  return d;
}
inline batch_sampler sampler() {
  return batch_sampler(corpus().train(), small_batch, small_gpt().context, 7);
}

inline double learning_rate(std::int64_t step) {
  return 2e-3 * (1.0 + 0.1 * static_cast<double>(step % 3));
}

inline world_mesh make_world_mesh() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return world_mesh(MPI_COMM_WORLD, {n});
}

// The one-rank reference of an N-rank run: the same mesh type over MPI_COMM_SELF, so the
// reference shares the N-rank run's instantiations instead of compiling the model a second
// time for another mesh type (half of these tests' compile time), and its collectives move
// nothing. What differs between the runs is what the comparison is about: the shards, the
// collectives and the ZeRO partitioning. zest::local_mesh has tests of its own (tests/mesh).
template <class Mesh = world_mesh>
Mesh make_single_mesh() {
  std::array<int, Mesh::axis_count> ones{};
  ones.fill(1);
  return Mesh(MPI_COMM_SELF, ones);
}

// Every parameter's stored value, whole, by name.
template <class P>
std::map<std::string, std::vector<float>> parameter_values(zero_engine<P>& engine) {
  std::map<std::string, std::vector<float>> out;
  for (const auto* p : engine.parameters()) out[p->name()] = p->whole_value();
  return out;
}

// Trains `steps` steps from `first`, returning the losses; the batch is laid out as
// TokenLayout (split over "dp" by default).
template <class TokenLayout = layout<split<'b', "dp">>, class P, class Model>
std::vector<double> train_steps(zero_engine<P>& engine, const Model& model, std::int64_t first,
                                std::int64_t steps) {
  auto s = sampler();
  std::vector<double> losses;
  for (std::int64_t k = first; k < first + steps; ++k) {
    const auto [in, tg] = s.template batch<TokenLayout>(engine.mesh(), static_cast<std::size_t>(k));
    losses.push_back(
        train_step(engine, model, in, tg, learning_rate(k), static_cast<std::uint64_t>(k)).loss);
  }
  return losses;
}

}  // namespace zest::testing
