// train_tp — one GPT on 2 ranks three ways, timed side by side: data parallel (dp 2),
// Megatron tensor parallel (tp 2), and tensor parallel with sequence parallelism (tp 2, the
// stream split over tp on the sequence). ZeRO-1 over dp, fp32.
//
//   mpiexec -n 2 ./bench_train_tp [--quick]
//
// The model is bench/train_zero's (vocab 96, context 128, width 256, 4 layers, 4 heads,
// global batch 16). The three are timed in alternating blocks of steps after warmup steps,
// a step's time the slowest rank's; the bytes each mesh axis sends per step come from the
// communicators' counters, and are checked against the closed forms of
// tests/nn/gpt_tensor_parallel_test.cpp. Prints on rank 0:
//
//   tp_tokens_per_s_dp2, _tp2, _tp2_sp     global tokens/s (median step)
//   tp_step_ratio_tp2_vs_dp2, tp_step_ratio_tp2_sp_vs_dp2    median step time ratios
//   tp_bytes_per_step_{dp,tp}_<config>     bytes this rank sends per step on each axis
//   tp_activation_peak_mib_<config>        peak live bytes of a step above the model states
//                                          (zest's own accounting): what SP saves
//   tp_bytes_match_formula                 1 when every config's tp bytes equal the formula
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "zest/comm/mpi_environment.hpp"
#include "zest/core/memory.hpp"
#include "zest/data/batches.hpp"
#include "zest/data/text_dataset.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/nn/gpt.hpp"
#include "zest/train/train_step.hpp"

namespace {
using mesh_t = zest::mesh<"dp", "tp">;
using policy = zest::training_policy<mesh_t, zest::zero_stage<1>, float>;
using data_parallel = zest::layout<zest::split<'b', "dp">>;
using sequence_parallel = zest::layout<zest::split<'b', "dp">, zest::split<'t', "tp">>;

struct step_figures {
  double seconds = 0;
  std::uint64_t dp_bytes = 0, tp_bytes = 0;
  std::int64_t peak_above_states = 0;
};

template <class Tokens>
struct trainer {
  const mesh_t* mesh;
  zest::zero_engine<policy> engine;
  zest::gpt<policy> model;
  std::int64_t states = 0;
  std::int64_t next = 0;
  trainer(const mesh_t& m, const zest::gpt_options& o)
      : mesh(&m), engine(m, {.seed = 3}), model(engine, o) {
    states = zest::memory::host_counters().live.load();
  }
  step_figures step(const zest::batch_sampler& sampler) {
    const auto [in, tg] = sampler.batch<Tokens>(*mesh, static_cast<std::size_t>(next++));
    const auto dp0 = mesh->axis(0).stats(), tp0 = mesh->axis(1).stats();
    auto& counters = zest::memory::host_counters();
    const std::int64_t live = counters.live.load();
    counters.peak.store(live);
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    (void)zest::train_step(engine, model, in, tg, 1e-3);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return {s, (mesh->axis(0).stats() - dp0).bytes_sent(),
            (mesh->axis(1).stats() - tp0).bytes_sent(), counters.peak.load() - live};
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);
  bool quick = false;
  for (int i = 1; i < argc; ++i) quick = quick || std::string_view(argv[i]) == "--quick";
  try {
    int world = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (world != 2) {
      if (rank == 0) std::fprintf(stderr, "train_tp: run it on 2 ranks\n");
      return 2;
    }
    zest::gpt_options o;
    o.vocab = 96;
    o.context = 128;
    o.width = 256;
    o.layers = 4;
    o.heads = 4;
    const std::size_t batch = 16;
    const auto data = zest::text_dataset::from_path();
    const zest::batch_sampler sampler(data.train(), batch, o.context, 1234);
    const mesh_t dp_mesh(MPI_COMM_WORLD, {2, 1}), tp_mesh(MPI_COMM_WORLD, {1, 2});
    trainer<data_parallel> dp2(dp_mesh, o);
    trainer<data_parallel> tp2(tp_mesh, o);
    trainer<sequence_parallel> sp2(tp_mesh, o);

    const int warmup = quick ? 1 : 2, rounds = quick ? 2 : 5, block = quick ? 1 : 2;
    std::vector<double> t_dp, t_tp, t_sp;
    step_figures f_dp, f_tp, f_sp;
    for (int i = 0; i < warmup; ++i) {
      f_dp = dp2.step(sampler);
      f_tp = tp2.step(sampler);
      f_sp = sp2.step(sampler);
    }
    for (int r = 0; r < rounds; ++r) {
      for (int k = 0; k < block; ++k) t_dp.push_back((f_dp = dp2.step(sampler)).seconds);
      for (int k = 0; k < block; ++k) t_tp.push_back((f_tp = tp2.step(sampler)).seconds);
      for (int k = 0; k < block; ++k) t_sp.push_back((f_sp = sp2.step(sampler)).seconds);
    }

    // The closed forms (P = 2, every size even): A = b s h of the whole batch (dp 1).
    const std::uint64_t rows = batch * o.context, A = rows * o.width, L = o.layers;
    const std::uint64_t replicated = o.context * o.width + 6 * o.width * L + 2 * o.width;
    const std::uint64_t scalar = rank == 0 ? 0 : 2 * sizeof(float);
    const auto all_reduce = [](std::uint64_t n) { return n * sizeof(float); };  // 2 n (P-1)/P
    const auto gathered = [](std::uint64_t n) { return n / 2 * sizeof(float); };
    const std::uint64_t tp_formula = all_reduce((4 * L + 2) * A + 3 * rows + replicated) + scalar;
    const std::uint64_t sp_formula = all_reduce(3 * rows + replicated) + scalar +
                                     2 * gathered((4 * L + 2) * A) +
                                     gathered(o.context * o.width + 2 * rows);
    int match = f_tp.tp_bytes == tp_formula && f_sp.tp_bytes == sp_formula ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &match, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);

    if (rank == 0) {
      const double tokens = static_cast<double>(batch * o.context);
      const double m_dp = median(t_dp), m_tp = median(t_tp), m_sp = median(t_sp);
      std::printf(
          "config    median step   tokens/s   dp bytes/step   tp bytes/step   peak above states\n");
      const auto line = [&](const char* name, double m, const step_figures& f) {
        std::printf("%-8s  %9.4f s  %9.0f  %14llu  %14llu  %10.1f MiB\n", name, m, tokens / m,
                    static_cast<unsigned long long>(f.dp_bytes),
                    static_cast<unsigned long long>(f.tp_bytes),
                    static_cast<double>(f.peak_above_states) / (1 << 20));
      };
      line("dp2", m_dp, f_dp);
      line("tp2", m_tp, f_tp);
      line("tp2+sp", m_sp, f_sp);
      std::printf("tp bytes: formula %llu (tp2), %llu (tp2+sp)\n",
                  static_cast<unsigned long long>(tp_formula),
                  static_cast<unsigned long long>(sp_formula));
      std::printf("METRIC tp_tokens_per_s_dp2 %.1f\n", tokens / m_dp);
      std::printf("METRIC tp_tokens_per_s_tp2 %.1f\n", tokens / m_tp);
      std::printf("METRIC tp_tokens_per_s_tp2_sp %.1f\n", tokens / m_sp);
      std::printf("METRIC tp_step_ratio_tp2_vs_dp2 %.4f\n", m_tp / m_dp);
      std::printf("METRIC tp_step_ratio_tp2_sp_vs_dp2 %.4f\n", m_sp / m_dp);
      std::printf("METRIC tp_bytes_per_step_dp_dp2 %llu\n",
                  static_cast<unsigned long long>(f_dp.dp_bytes));
      std::printf("METRIC tp_bytes_per_step_tp_tp2 %llu\n",
                  static_cast<unsigned long long>(f_tp.tp_bytes));
      std::printf("METRIC tp_bytes_per_step_tp_tp2_sp %llu\n",
                  static_cast<unsigned long long>(f_sp.tp_bytes));
      std::printf("METRIC tp_activation_peak_mib_dp2 %.2f\n",
                  static_cast<double>(f_dp.peak_above_states) / (1 << 20));
      std::printf("METRIC tp_activation_peak_mib_tp2 %.2f\n",
                  static_cast<double>(f_tp.peak_above_states) / (1 << 20));
      std::printf("METRIC tp_activation_peak_mib_tp2_sp %.2f\n",
                  static_cast<double>(f_sp.peak_above_states) / (1 << 20));
      std::printf("METRIC tp_bytes_match_formula %d\n", match);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_tp: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 0;
}
