// recompute — activation recomputation (zero_options::recompute) on one GPT under ZeRO-3:
// peak activation memory per rank and step time under none, selective and full, and the
// planner's activation figures (zest/zero/transformer_plan.hpp) for the same model.
//
//   mpiexec -n 2 ./bench_recompute [--quick]
//
// The model: vocab 96, context 128, width 256, 4 layers, 8 heads, global batch 16, fp32, no
// dropout (bench_train_zero's, with 8 heads so that the attention scores weigh as in larger
// models). Activation bytes are zest's own accounting: the peak live bytes of a step (from
// train_step) minus the bytes live before it (the model states), on each rank; the ranks hold
// equal shares. The modes are timed in alternating blocks of steps after a warmup, so that load
// from other processes falls on all alike; a step's time is the slowest rank's, medians.
// Prints on rank 0:
//
//   recompute_peak_activation_mib_{none,selective,full}   per rank
//   recompute_activation_ratio_{selective,full}_vs_none   peak activations / none's
//   recompute_step_ratio_{selective,full}_vs_none         median step time / none's
//   recompute_planner_ratio_{none,selective,full}         the planner's activations (fp32,
//                                                         no masks) / the measured peak
//
// Every mode trains the same numbers (tests/train/recompute_test.cpp checks it bit for bit);
// the bench checks the losses of its steps are equal and says so.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "zest/data/batches.hpp"
#include "zest/data/text_dataset.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/nn/gpt.hpp"
#include "zest/train/train_step.hpp"
#include "zest/zero/transformer_plan.hpp"

namespace {

using mesh_t = zest::mesh<"dp">;
using policy = zest::training_policy<mesh_t, zest::zero_stage<3>, float>;

constexpr std::size_t batch = 16, context = 128, width = 256, layers = 4, heads = 8;
constexpr std::array modes{zest::recomputation::none, zest::recomputation::selective,
                           zest::recomputation::full};

zest::gpt_options model_options() {
  zest::gpt_options o;
  o.vocab = 96;
  o.context = context;
  o.width = width;
  o.layers = layers;
  o.heads = heads;
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct run {
  zest::zero_engine<policy> engine;
  zest::gpt<policy> model;
  std::int64_t peak_activations = 0;
  std::vector<double> seconds, losses;
  run(const mesh_t& mesh, zest::recomputation mode)
      : engine(mesh,
               [&] {
                 zest::zero_options o;
                 o.seed = 5;
                 o.recompute = mode;
                 return o;
               }()),
        model(engine, model_options()) {}
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  {
    int world = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const mesh_t mesh(MPI_COMM_WORLD, {world});
    const auto data = zest::text_dataset::from_path();
    zest::batch_sampler sampler(data.train(), batch, context, 3);

    std::vector<std::unique_ptr<run>> runs;
    for (auto m : modes) runs.push_back(std::make_unique<run>(mesh, m));

    const int warmup = 1, blocks = quick ? 2 : 4, per_block = quick ? 1 : 2;
    std::size_t step = 0;
    for (int b = -warmup; b < blocks; ++b) {
      for (int k = 0; k < per_block; ++k, ++step) {
        const auto [in, tg] = sampler.batch<zest::layout<zest::split<'b', "dp">>>(mesh, step);
        for (auto& r : runs) {
          MPI_Barrier(MPI_COMM_WORLD);
          const std::int64_t before = zest::memory::live_bytes();
          const auto s = zest::train_step(r->engine, r->model, in, tg, 1e-3, step);
          double t = s.seconds;
          MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
          r->peak_activations = std::max(r->peak_activations, s.peak_bytes - before);
          r->losses.push_back(s.loss);
          if (b >= 0) r->seconds.push_back(t);
        }
      }
    }

    zest::transformer_config c = zest::gpt_transformer("bench", layers, width, heads, 96, context);
    c.dropout = false;
    c.tied_output = false;
    const bool same = runs[1]->losses == runs[0]->losses && runs[2]->losses == runs[0]->losses;
    if (rank == 0) {
      std::printf(
          "recompute: GPT %zu layers, width %zu, %zu heads, batch %zu x %zu, ZeRO-3, "
          "%d ranks; losses equal across modes: %s\n",
          layers, width, heads, batch, context, world, same ? "yes" : "NO");
      std::printf("%-10s %16s %12s %14s %16s\n", "mode", "peak act MiB", "vs none", "step s",
                  "planner MiB");
      const double none_peak = static_cast<double>(runs[0]->peak_activations);
      const double none_time = median(runs[0]->seconds);
      for (std::size_t i = 0; i < modes.size(); ++i) {
        const std::string name(zest::name_of(modes[i]));
        const double peak = static_cast<double>(runs[i]->peak_activations);
        zest::parallel_layout p;
        p.dp = world;
        p.zero_stage = 3;
        p.recompute = modes[i];
        p.micro_batch = batch / static_cast<std::size_t>(world);
        const double planned = zest::plan_transformer(c, p, zest::fp32_adam).activations.total();
        std::printf("%-10s %16.2f %12.3f %14.4f %16.2f\n", name.c_str(), peak / 1048576.0,
                    peak / none_peak, median(runs[i]->seconds), planned / 1048576.0);
        std::printf("METRIC recompute_peak_activation_mib_%s %.4f\n", name.c_str(),
                    peak / 1048576.0);
        std::printf("METRIC recompute_planner_ratio_%s %.4f\n", name.c_str(), planned / peak);
        if (i > 0) {
          std::printf("METRIC recompute_activation_ratio_%s_vs_none %.4f\n", name.c_str(),
                      peak / none_peak);
          std::printf("METRIC recompute_step_ratio_%s_vs_none %.4f\n", name.c_str(),
                      median(runs[i]->seconds) / none_time);
        }
      }
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
