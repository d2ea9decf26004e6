// train_zero — one GPT trained under ZeRO stages 0-3 on the same ranks in one run: step
// time, bytes communicated and model-state memory against the ZeRO table's formulas
// (docs/design-notes.md, "ZeRO stages"), and the model's FLOP rate against single-thread
// sgemm measured in the same process.
//
//   mpiexec -n 2 ./bench_train_zero [--quick]
//
// The model: vocab 96, context 128, width 256, 4 layers, 4 heads, global batch 16, fp32 (big
// enough that compute dominates a step; --quick times fewer steps of the same model). Every
// parameter's first dim (the one the stages split) is even, so the closed forms hold exactly
// on 2 ranks. Prints on rank 0:
//
//   zero3_step_ratio_vs_ddp         median step time, stage 3 / stage 0       target <= 1.25
//   zero{1,2,3}_comm_ratio_vs_formula   bytes of parameter and gradient collectives per
//                                   step (train_step's traffic) / zero_formula's
//                                   elements_sent * 4                         target 1.0
//   zero{1,2,3}_memory_ratio_vs_formula model-state bytes per rank (zest's allocation
//                                   count around engine and model construction) /
//                                   zero_formula's memory_bytes              target 0.95-1.05
//   train_tokens_per_s              global tokens/s of stage 3 (and _zero0 of stage 0)
//   train_flops_ratio_vs_blas       model FLOP/s per rank of the faster of stages 0 and 3
//                                   (FLOPs counted in model_flops_per_step), median step /
//                                   single-thread sgemm FLOP/s (n = 1024, every rank at
//                                   once), median call                        target >= 0.5
//   schedule_check_fraction_of_step zest::check_schedule(mesh) (which ends every optimizer
//                                   step), median of 50, / the median stage 3 step
//                                                                             target <= 0.005
//
// Stages 0 and 3 are timed in alternating blocks of steps (after warmup steps), so that
// load from other processes on a shared machine falls on both alike; a step's time is the
// slowest rank's, all ranks starting together after a barrier. The sgemm reference is
// sampled between the blocks, under the same load. Both ratios use medians: a best-of
// comparison would favour the sgemm, whose 20 ms calls find the machine's quiet moments
// far more often than 0.4-0.7 s steps do (the best-of figure is printed too).
//
// The table also shows, per stage: seconds inside MPI per step, measured through MPI's
// profiling interface (bench/mpi_profile.hpp: the MPI calls zest's communicators make,
// timed and forwarded to their PMPI_ names), which tells how much of
// stage 3's extra step time is communication not hidden behind compute; and the minor page
// faults per step (fresh memory touched for the first time: what the allocations of a step
// cost the kernel). A last pass splits a step into forward, backward and optimizer step.

#include <cblas.h>  // the reference; zest itself does not include it
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <random>
#include <string_view>
#include <vector>

#include "mpi_profile.hpp"  // defines the MPI calls zest makes: include once
#include "zest/comm/mpi_environment.hpp"
#include "zest/core/memory.hpp"
#include "zest/data/batches.hpp"
#include "zest/data/text_dataset.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/nn/gpt.hpp"
#include "zest/train/train_step.hpp"
#include "zest/zero/planner.hpp"

#if !ZEST_HAS_BLAS
#error "train_zero compares against OpenBLAS: build with -DZEST_HAS_BLAS=1 -lopenblas"
#endif

namespace {

using clock_type = std::chrono::steady_clock;
using mesh_t = zest::mesh<"dp">;
template <int K>
using policy_of = zest::training_policy<mesh_t, zest::zero_stage<K>, float>;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}
// CPU seconds this process has used: unlike wall time, not stretched when other processes
// take the cores (but time spent polling in MPI counts).
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double max_over_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return x;
}
double mean_over_ranks(double x) {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return x / n;
}

// Minor page faults of this process so far: fresh memory touched for the first time.
double minor_page_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_minflt);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct settings {
  zest::gpt_options model;
  std::size_t batch = 16;  // global, in sequences
  int warmup = 3;          // steps per stage before timing (stages 0 and 3)
  int rounds = 5;          // alternating blocks of stages 0 and 3
  int block = 2;           // timed steps per stage per round
  int other_steps = 3;     // timed steps of stages 1 and 2 (after one warmup step)
  int phase_steps = 2;     // steps of the forward/backward/step breakdown
  std::size_t gemm_n = 1024;
  int gemm_reps = 4;  // sgemm calls per round, each timed on its own
};

// Model FLOPs of one training step (a multiply-add is 2 FLOPs), counting the matmuls the
// model performs. With T = batch * context tokens, m the width, h = mlp_ratio * m the hidden
// width, c the context, V the (padded) vocabulary and L layers, forward:
//   q, k, v, attn.proj     4 * 2 T m m       per layer
//   mlp.fc, mlp.proj       2 * 2 T m h       per layer
//   q k^T and p v          2 * 2 T c m       per layer (the full c x c scores; the causal
//                                            mask is applied after, as the model does)
//   lm_head                2 T m V
// Backward computes the gradient of both operands of each matmul: twice the forward. So
//   FLOPs = 3 * (2 T (L (4 m^2 + 2 m h) + m V) + 4 L T c m)  =  6 Psi_matmul T + 12 L T c m.
// Embedding lookups, biases, layer norms, GELU, softmax and the optimizer are not counted.
double model_flops_per_step(const zest::gpt_options& o, std::size_t batch) {
  const double t = static_cast<double>(batch * o.context);
  const double m = static_cast<double>(o.width);
  const double h = static_cast<double>(o.mlp_ratio * o.width);
  const double c = static_cast<double>(o.context);
  const double v = static_cast<double>(o.vocab);
  const double l = static_cast<double>(o.layers);
  const double forward = 2 * t * (l * (4 * m * m + 2 * m * h) + m * v) + 4 * l * t * c * m;
  return 3 * forward;
}

// One step's figures.
struct step_sample {
  double seconds = 0;       // the step (max over ranks)
  double mpi_seconds = 0;   // inside MPI during the step (max over ranks)
  std::uint64_t bytes = 0;  // parameter and gradient collectives sent by this rank
  double page_faults = 0;   // minor page faults during the step (mean over ranks)
  double cpu_seconds = 0;   // CPU time of the step (mean over ranks)
};

// A stage's engine and model, with the model-state bytes their construction allocated.
template <int K>
struct trainer {
  using P = policy_of<K>;
  std::int64_t state_bytes = 0;
  std::unique_ptr<zest::zero_engine<P>> engine;
  std::unique_ptr<zest::gpt<P>> model;
  std::size_t steps = 0;

  trainer(const mesh_t& mesh, const zest::gpt_options& o) {
    const std::int64_t before = zest::memory::live_bytes();
    engine = std::make_unique<zest::zero_engine<P>>(mesh, zest::zero_options{.seed = 1});
    model = std::make_unique<zest::gpt<P>>(*engine, o);
    state_bytes = zest::memory::live_bytes() - before;
  }

  std::uint64_t parameter_count() const { return engine->parameter_count(); }

  // One train_step on batch `steps` of the sampler (the same batches for every stage).
  step_sample step(const mesh_t& mesh, const zest::batch_sampler& sampler) {
    const auto [inputs, targets] = sampler.batch<"dp">(mesh, steps);
    MPI_Barrier(MPI_COMM_WORLD);
    const double mpi_before = bench_mpi::total_seconds();
    const double faults_before = minor_page_faults();
    const double cpu_before = cpu_seconds();
    const auto r = zest::train_step(*engine, *model, inputs, targets, 1e-3,
                                    zest::splitmix64(static_cast<std::uint64_t>(steps)));
    const double in_mpi = bench_mpi::total_seconds() - mpi_before;
    const double faults = minor_page_faults() - faults_before;
    const double cpu = cpu_seconds() - cpu_before;
    ++steps;
    step_sample s;
    s.seconds = max_over_ranks(r.seconds);
    s.mpi_seconds = max_over_ranks(in_mpi);
    s.bytes = r.traffic.bytes_sent();
    s.page_faults = mean_over_ranks(faults);
    s.cpu_seconds = mean_over_ranks(cpu);
    return s;
  }

  // The same step as train_step, timed in its phases: forward (with the loss's value),
  // backward (with the gradient collectives) and the optimizer step. Seconds and seconds
  // inside MPI per phase, this rank's.
  std::array<double, 6> phased_step(const mesh_t& mesh, const zest::batch_sampler& sampler) {
    const auto [inputs, targets] = sampler.batch<"dp">(mesh, steps);
    MPI_Barrier(MPI_COMM_WORLD);
    std::array<double, 6> out{};
    double mpi0 = bench_mpi::total_seconds();
    auto t0 = clock_type::now();
    {
      zest::autodiff::tape t;
      auto loss = model->loss(t, inputs, targets, zest::splitmix64(steps));
      (void)engine->scalar_value(loss.value());
      out[0] = seconds_since(t0);
      out[3] = bench_mpi::total_seconds() - mpi0;
      mpi0 = bench_mpi::total_seconds();
      t0 = clock_type::now();
      engine->backward(loss);
    }
    out[1] = seconds_since(t0);
    out[4] = bench_mpi::total_seconds() - mpi0;
    mpi0 = bench_mpi::total_seconds();
    t0 = clock_type::now();
    (void)engine->step(1e-3);
    out[2] = seconds_since(t0);
    out[5] = bench_mpi::total_seconds() - mpi0;
    ++steps;
    return out;
  }
};

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// The reference: one n x n x n single-thread sgemm, on every rank at once (as the training
// step runs: the cores and the memory system are shared alike). A sample is one call's
// FLOP/s, the mean over ranks; samples are taken between the blocks of training steps, so
// that they see the same load from other processes as the steps.
class sgemm_reference {
 public:
  explicit sgemm_reference(std::size_t n)
      : n_(n), a_(random_floats(n * n, 1)), b_(random_floats(n * n, 2)), c_(n * n) {
    run();  // warm up: OpenBLAS's buffers, the pages of c
  }
  // `reps` calls, each timed on its own (rank mean).
  void sample(int reps) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double flops =
        2.0 * static_cast<double>(n_) * static_cast<double>(n_) * static_cast<double>(n_);
    for (int i = 0; i < reps; ++i) {
      const auto t0 = clock_type::now();
      const double cpu0 = cpu_seconds();
      run();
      const double cpu = cpu_seconds() - cpu0;
      rates_.push_back(mean_over_ranks(flops / seconds_since(t0)));
      cpu_rates_.push_back(mean_over_ranks(flops / cpu));
    }
  }
  double median_rate() const { return median(rates_); }
  double best_rate() const { return *std::max_element(rates_.begin(), rates_.end()); }
  double median_cpu_rate() const { return median(cpu_rates_); }

 private:
  void run() {
    const int k = static_cast<int>(n_);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, k, k, k, 1.0F, a_.data(), k, b_.data(),
                k, 0.0F, c_.data(), k);
  }
  std::size_t n_;
  std::vector<float> a_, b_, c_;
  std::vector<double> rates_, cpu_rates_;
};

struct stage_figures {
  int stage = 0;
  std::vector<double> seconds, mpi, faults, cpu;
  std::uint64_t bytes = 0;
  bool bytes_steady = true;  // every measured step sent the same bytes
  std::int64_t state_bytes = 0;
  double formula_bytes = 0, formula_memory = 0;
};

void record(stage_figures& f, const step_sample& s, bool timed) {
  if (f.seconds.empty() && f.bytes == 0) {
    f.bytes = s.bytes;
  } else if (s.bytes != f.bytes) {
    f.bytes_steady = false;
  }
  if (timed) {
    f.seconds.push_back(s.seconds);
    f.mpi.push_back(s.mpi_seconds);
    f.faults.push_back(s.page_faults);
    f.cpu.push_back(s.cpu_seconds);
  }
}

template <int K>
stage_figures figures_of(const trainer<K>& t, const mesh_t& mesh) {
  stage_figures f;
  f.stage = K;
  f.state_bytes = t.state_bytes;
  const auto psi = static_cast<double>(t.parameter_count());
  const auto n = static_cast<double>(mesh.size(0));
  const auto formula = zest::zero_formula(K, psi, n, zest::fp32_adam);
  f.formula_bytes = formula.elements_sent * sizeof(float);
  f.formula_memory = formula.memory_bytes;
  return f;
}

// Stages 1 and 2: one warmup step, then a few timed ones; built and freed here.
template <int K>
stage_figures run_other(const mesh_t& mesh, const settings& s, const zest::batch_sampler& sampler) {
  trainer<K> t(mesh, s.model);
  stage_figures f = figures_of(t, mesh);
  record(f, t.step(mesh, sampler), false);
  for (int i = 0; i < s.other_steps; ++i) record(f, t.step(mesh, sampler), true);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);
  openblas_set_num_threads(1);
  bool quick = false;
  for (int i = 1; i < argc; ++i) quick = quick || std::string_view(argv[i]) == "--quick";

  try {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const mesh_t mesh(MPI_COMM_WORLD, {world});
    const bool root = mesh.rank() == 0;

    settings s;
    s.model.vocab = 96;  // the corpus's 86 bytes, padded to a multiple of 32
    s.model.context = 128;
    s.model.width = 256;
    s.model.layers = 4;
    s.model.heads = 4;
    if (quick) {  // the same model (the targets are about it), fewer steps
      s.warmup = 1;
      s.rounds = 2;
      s.block = 2;
      s.other_steps = 1;
      s.phase_steps = 1;
      s.gemm_reps = 3;
    }
    const auto data = zest::text_dataset::from_path();
    const zest::batch_sampler sampler(data.train(), s.batch, s.model.context, 1234);

    // Stages 1 and 2 first, each alone in memory; then 0 and 3 side by side.
    stage_figures f1 = run_other<1>(mesh, s, sampler);
    stage_figures f2 = run_other<2>(mesh, s, sampler);

    trainer<0> t0(mesh, s.model);
    trainer<3> t3(mesh, s.model);
    stage_figures f0 = figures_of(t0, mesh);
    stage_figures f3 = figures_of(t3, mesh);
    for (int i = 0; i < s.warmup; ++i) {
      record(f0, t0.step(mesh, sampler), false);
      record(f3, t3.step(mesh, sampler), false);
    }
    sgemm_reference blas(s.gemm_n);
    for (int round = 0; round < s.rounds; ++round) {
      blas.sample(s.gemm_reps);
      const bool zero_first = round % 2 == 0;
      for (int side = 0; side < 2; ++side) {
        for (int i = 0; i < s.block; ++i) {
          if ((side == 0) == zero_first) {
            record(f0, t0.step(mesh, sampler), true);
          } else {
            record(f3, t3.step(mesh, sampler), true);
          }
        }
      }
    }
    // Paired ratio: round r's stage 3 block against its stage 0 block.
    std::vector<double> block_ratios;
    for (int round = 0; round < s.rounds; ++round) {
      const auto at = static_cast<std::ptrdiff_t>(round * s.block);
      const std::vector<double> a(f3.seconds.begin() + at, f3.seconds.begin() + at + s.block);
      const std::vector<double> b(f0.seconds.begin() + at, f0.seconds.begin() + at + s.block);
      block_ratios.push_back(median(a) / median(b));
    }

    // Phases, for the record: forward, backward, step (and MPI inside each), rank-mean.
    std::array<double, 6> phases0{}, phases3{};
    for (int i = 0; i < s.phase_steps; ++i) {
      const auto p0 = t0.phased_step(mesh, sampler);
      const auto p3 = t3.phased_step(mesh, sampler);
      for (std::size_t k = 0; k < 6; ++k) {
        phases0[k] += mean_over_ranks(p0[k]) / s.phase_steps;
        phases3[k] += mean_over_ranks(p3[k]) / s.phase_steps;
      }
    }

    blas.sample(s.gemm_reps);

    // The schedule check that ends every optimizer step (zest::check_schedule: one small
    // all-gather per communicator of the mesh), timed alone: its share of a step.
    std::vector<double> checks;
    for (int i = 0; i < 50; ++i) {
      const auto started = std::chrono::steady_clock::now();
      zest::check_schedule(mesh, "bench");
      checks.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    }

    // ---- report --------------------------------------------------------------------------
    const double step0 = median(f0.seconds), step3 = median(f3.seconds);
    const double mpi0 = median(f0.mpi), mpi3 = median(f3.mpi);
    const double tokens = static_cast<double>(s.batch * s.model.context);
    const double flops = model_flops_per_step(s.model, s.batch);
    // FLOP rate of the faster stage (median steps) against the median sgemm call; the
    // best of each side printed for comparison.
    const bool zero3_faster = step3 < step0;
    const auto& fastest = zero3_faster ? f3.seconds : f0.seconds;
    const double flops_per_rank = flops / world / median(fastest);
    const double flops_ratio = flops_per_rank / blas.median_rate();
    const double best_step = *std::min_element(fastest.begin(), fastest.end());
    const double best_flops_ratio = flops / world / best_step / blas.best_rate();
    const std::uint64_t psi = t0.parameter_count();

    if (root) {
      std::printf(
          "train_zero: GPT vocab %zu, context %zu, width %zu, %zu layers, %zu heads: "
          "%llu parameters; global batch %zu x %zu tokens; %d ranks, fp32\n",
          s.model.vocab, s.model.context, s.model.width, s.model.layers, s.model.heads,
          static_cast<unsigned long long>(psi), s.batch, s.model.context, world);
      std::printf("%-6s %8s %8s %7s %7s %10s %10s %9s %10s %10s %7s\n", "stage", "step s",
                  "in MPI s", "tok/s", "faults", "sent B", "formula B", "ratio", "states B",
                  "formula B", "ratio");
      for (const stage_figures* f : {&f0, &f1, &f2, &f3}) {
        const double step = median(f->seconds);
        std::printf("%-6d %8.4f %8.4f %7.0f %7.0f %10llu %10.0f %9.6f %10lld %10.0f %7.4f%s\n",
                    f->stage, step, median(f->mpi), tokens / step, median(f->faults),
                    static_cast<unsigned long long>(f->bytes), f->formula_bytes,
                    f->formula_bytes > 0 ? static_cast<double>(f->bytes) / f->formula_bytes : 0.0,
                    static_cast<long long>(f->state_bytes), f->formula_memory,
                    static_cast<double>(f->state_bytes) / f->formula_memory,
                    f->bytes_steady ? "" : "  (bytes varied between steps)");
      }
      std::printf(
          "stages 0 and 3: %d warmup steps, then %d alternating blocks of %d steps; "
          "stages 1, 2: %d step(s) after 1 warmup\n",
          s.warmup, s.rounds, s.block, s.other_steps);
      std::printf("stage 3 / stage 0 step time: %.3f (ratio of medians), per-round block ratios",
                  step3 / step0);
      for (double r : block_ratios) std::printf(" %.3f", r);
      std::printf("\n");
      // Stage 3's extra step time against its extra time inside MPI: the part of the extra
      // that is communication not hidden behind compute (under 2 % of a step: noise).
      const double extra = step3 - step0;
      std::printf(
          "overlap: inside MPI per step %.4f s under stage 3, %.4f s under stage 0; "
          "stage 3's extra step time %.4f s",
          mpi3, mpi0, extra);
      if (extra > 0.02 * step0) {
        std::printf(", of which the extra time inside MPI is %.0f%%\n",
                    100.0 * std::min((mpi3 - mpi0) / extra, 1.0));
      } else {
        std::printf(" (within 2%% of stage 0: nothing to attribute)\n");
      }
      std::printf(
          "phases (s, rank mean; inside MPI in brackets)  forward           backward"
          "          step\n");
      for (const auto* p : {&phases0, &phases3}) {
        std::printf(
            "  stage %d                                      %.4f (%.4f)   %.4f (%.4f)"
            "   %.4f (%.4f)\n",
            p == &phases0 ? 0 : 3, (*p)[0], (*p)[3], (*p)[1], (*p)[4], (*p)[2], (*p)[5]);
      }
      std::printf(
          "model FLOPs per step %.3e (per rank %.3e); stage %d: %.2f GFLOP/s per "
          "rank; sgemm (n=%zu, one thread) %.2f GFLOP/s: ratio %.3f (best of each: "
          "%.3f)\n",
          flops, flops / world, zero3_faster ? 3 : 0, flops_per_rank * 1e-9, s.gemm_n,
          blas.median_rate() * 1e-9, flops_ratio, best_flops_ratio);
      // The same ratio in CPU time, which time slicing by other processes does not stretch:
      // a cross-check on a loaded machine (polling inside MPI counts as CPU time here).
      const double cpu_step = median((zero3_faster ? f3 : f0).cpu);
      std::printf(
          "in CPU time: %.4f s per step and rank (stage 0 %.4f, stage 3 %.4f), "
          "%.2f model GFLOP per CPU second; sgemm %.2f: ratio %.3f\n",
          cpu_step, median(f0.cpu), median(f3.cpu), flops / world / cpu_step * 1e-9,
          blas.median_cpu_rate() * 1e-9, flops / world / cpu_step / blas.median_cpu_rate());

      std::printf("METRIC zero3_step_ratio_vs_ddp %.4f\n", step3 / step0);
      for (const stage_figures* f : {&f1, &f2, &f3}) {
        std::printf("METRIC zero%d_comm_ratio_vs_formula %.6f\n", f->stage,
                    static_cast<double>(f->bytes) / f->formula_bytes);
      }
      for (const stage_figures* f : {&f1, &f2, &f3}) {
        std::printf("METRIC zero%d_memory_ratio_vs_formula %.6f\n", f->stage,
                    static_cast<double>(f->state_bytes) / f->formula_memory);
      }
      std::printf("METRIC train_tokens_per_s %.1f\n", tokens / step3);
      std::printf("METRIC train_tokens_per_s_zero0 %.1f\n", tokens / step0);
      std::printf("METRIC train_flops_ratio_vs_blas %.4f\n", flops_ratio);
      std::printf("schedule check: %.1f us (median of 50), %.4f %% of a stage 3 step\n",
                  median(checks) * 1e6, 100 * median(checks) / step3);
      std::printf("METRIC schedule_check_fraction_of_step %.6f\n", median(checks) / step3);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_zero: %s\n", e.what());
    return 1;
  }
}
