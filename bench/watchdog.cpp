// watchdog — what the collective watchdog costs (zest/comm/checked.hpp): the same ZeRO-3
// training step, and the same all_reduce, with the watchdog on (the default deadline) and
// off (ZEST_WATCHDOG_MS=0: MPI's blocking calls), in alternating blocks in one process.
//
//   mpiexec -n 2 ./bench_watchdog [--quick]
//
// The model is bench/train_zero.cpp's (vocab 96, context 128, width 256, 4 layers, 4 heads,
// global batch 16, fp32). Prints on rank 0:
//
//   watchdog_step_ratio           median over rounds of (median step time with the watchdog
//                                 / median without), paired block by block      target <= 1.02
//   watchdog_step_s               median step time with the watchdog (and _off without)
//   watchdog_collectives_per_step zest collectives one step makes (all axes)
//   watchdog_allreduce_us_<n>     median time of one all_reduce of n floats with the
//                                 watchdog (and _off without), n = 8 and 262144 (1 MiB)
//
// A step's time is the slowest rank's, all ranks starting together after a barrier. With
// the watchdog a collective is MPI's non-blocking form polled with MPI_Test against the
// deadline; without, the blocking call; so the ratio holds both the polling and any
// difference between MPICH's blocking and non-blocking algorithms.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string_view>
#include <vector>

#include "zest/comm/checked.hpp"
#include "zest/comm/mpi_environment.hpp"
#include "zest/data/batches.hpp"
#include "zest/data/text_dataset.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/nn/gpt.hpp"
#include "zest/train/train_step.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using mesh_t = zest::mesh<"dp">;
using policy = zest::training_policy<mesh_t, zest::zero_stage<3>, float>;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}
double max_over_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return x;
}
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The deadline of one side of the comparison.
void watchdog_on(bool on) {
  zest::set_watchdog(on ? zest::checked_mode_settings{}.watchdog : std::chrono::milliseconds(0));
}

// Median time of `reps` all_reduce calls of n floats (max over ranks of each call).
double allreduce_seconds(mesh_t& mesh, std::size_t n, int reps) {
  std::vector<float> x(n, 1.0F);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = clock_type::now();
    mesh.world().all_reduce(std::span<float>(x));
    t.push_back(max_over_ranks(seconds_since(t0)));
  }
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);
  bool quick = false;
  for (int i = 1; i < argc; ++i) quick = quick || std::string_view(argv[i]) == "--quick";
  try {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    mesh_t mesh(MPI_COMM_WORLD, {world});
    const bool root = mesh.rank() == 0;
    zest::set_checked_mode(false);  // the default mode is what is measured

    zest::gpt_options o;
    o.vocab = 96;
    o.context = 128;
    o.width = 256;
    o.layers = 4;
    o.heads = 4;
    const std::size_t batch = 16;
    const int warmup = 2, rounds = quick ? 3 : 6, block = 2;
    const auto data = zest::text_dataset::from_path();
    const zest::batch_sampler sampler(data.train(), batch, o.context, 1234);
    zest::zero_engine<policy> engine(mesh, zest::zero_options{.seed = 1});
    zest::gpt<policy> model(engine, o);

    std::size_t steps = 0;
    const auto step = [&] {
      const auto [inputs, targets] = sampler.batch<"dp">(mesh, steps);
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = clock_type::now();
      zest::train_step(engine, model, inputs, targets, 1e-3,
                       zest::splitmix64(static_cast<std::uint64_t>(steps)));
      ++steps;
      return max_over_ranks(seconds_since(t0));
    };
    const auto collectives = [&] {
      std::uint64_t calls = mesh.world().stats().calls();
      for (int a = 0; a < static_cast<int>(mesh_t::axis_count); ++a) {
        calls += mesh.axis(static_cast<std::size_t>(a)).stats().calls();
      }
      return calls;
    };

    for (int i = 0; i < warmup; ++i) step();
    const std::uint64_t calls_before = collectives();
    std::vector<double> on, off, ratios;
    for (int round = 0; round < rounds; ++round) {
      std::vector<double> a, b;
      for (int side = 0; side < 2; ++side) {
        const bool with = (side == 0) == (round % 2 == 0);
        watchdog_on(with);
        for (int i = 0; i < block; ++i) (with ? a : b).push_back(step());
      }
      on.insert(on.end(), a.begin(), a.end());
      off.insert(off.end(), b.begin(), b.end());
      ratios.push_back(median(a) / median(b));
    }
    const double per_step =
        static_cast<double>(collectives() - calls_before) / static_cast<double>(steps - warmup);

    const int reps = quick ? 200 : 1000;
    std::vector<double> small_on, small_off, big_on, big_off;
    for (int round = 0; round < 4; ++round) {
      watchdog_on(true);
      small_on.push_back(allreduce_seconds(mesh, 8, reps));
      big_on.push_back(allreduce_seconds(mesh, 262144, reps / 10));
      watchdog_on(false);
      small_off.push_back(allreduce_seconds(mesh, 8, reps));
      big_off.push_back(allreduce_seconds(mesh, 262144, reps / 10));
    }
    watchdog_on(true);

    if (root) {
      std::printf("watchdog: %d ranks, ZeRO-3 GPT (width %zu, %zu layers), %d rounds of %d steps\n",
                  world, o.width, o.layers, rounds, block);
      std::printf("METRIC watchdog_step_ratio %.4f\n", median(ratios));
      std::printf("METRIC watchdog_step_s %.4f\n", median(on));
      std::printf("METRIC watchdog_step_s_off %.4f\n", median(off));
      std::printf("METRIC watchdog_collectives_per_step %.1f\n", per_step);
      std::printf("METRIC watchdog_allreduce_us_8 %.2f\n", 1e6 * median(small_on));
      std::printf("METRIC watchdog_allreduce_us_8_off %.2f\n", 1e6 * median(small_off));
      std::printf("METRIC watchdog_allreduce_us_262144 %.1f\n", 1e6 * median(big_on));
      std::printf("METRIC watchdog_allreduce_us_262144_off %.1f\n", 1e6 * median(big_off));
    }
    return 0;
  } catch (const std::exception& e) {
    zest::report_and_abort(e);
  }
}
