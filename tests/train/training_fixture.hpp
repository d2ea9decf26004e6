// Shared pieces of the training tests: a small GPT whose every parameter splits evenly over
// 1, 2 and 4 ranks (so the ZeRO table's closed forms hold exactly, docs/design-notes.md), a
// corpus, and runs.
#pragma once

#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
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

// A fresh directory that every rank of the job names alike (rank 0 makes it): for checkpoints.
inline std::filesystem::path shared_temp_dir(const char* tag) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  long id = static_cast<long>(::getpid());
  MPI_Bcast(&id, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  const auto dir = std::filesystem::temp_directory_path() /
                   ("zest-train-" + std::string(tag) + "-" + std::to_string(id));
  if (rank == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

// Two runs' losses, step by step, to `relative`.
inline void check_same_losses(const std::vector<double>& got, const std::vector<double>& want,
                              double relative = 1e-5) {
  REQUIRE(got.size() == want.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    INFO("step " << k << ": " << got[k] << " vs " << want[k]);
    CHECK(std::abs(got[k] - want[k]) <= relative * std::abs(want[k]));
  }
}

// Two runs' parameters (parameter_values), element by element, to `absolute`.
inline void check_same_parameters(const std::map<std::string, std::vector<float>>& got,
                                  const std::map<std::string, std::vector<float>>& want,
                                  double absolute = 1e-5) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, values] : got) {
    const auto& ref = want.at(name);
    REQUIRE(values.size() == ref.size());
    double worst = 0;
    for (std::size_t i = 0; i < values.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(values[i] - ref[i])));
    INFO("parameter " << name << ": largest difference " << worst);
    CHECK(worst <= absolute);
  }
}

}  // namespace zest::testing
