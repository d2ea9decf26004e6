// sharded_einsum — a ZeRO-3 dense layer through zest against the same work written by hand,
// both measured in the same run.
//
//   mpiexec -n 2 ./bench_sharded_einsum [--quick]
//
// zest:   y = einsum<"bsm,mh->bsh">(x, w), x split(b:dp), w stored split(m:dp) on a 1-axis
//         mesh<"dp">: the plan all-gathers w over dp, then one local GEMM per rank.
// manual: MPI_Allgather of the same weight shard into a preallocated buffer, then one
//         single-thread cblas_sgemm on the same data into a preallocated output.
// Each round runs both, in alternating order, after a barrier; a call's time is the slowest
// rank's. The metric is the interquartile mean of the per-round time ratios zest / manual
// (robust on a shared, noisy machine, like bench/collectives.cpp); the table also shows the
// ratio of the medians and of the best times:
//
//   METRIC sharded_einsum_ratio_vs_manual <zest / manual>     target <= 1.05
//
// Rank 0 also prints where zest's time goes: its gather (redistribute of w to replicate)
// against MPI_Allgather, its local contraction (host::contract on the same shards) against
// sgemm, and the allocation of the zero-filled output tensor.
#include <cblas.h>  // the reference; zest itself does not include it
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zest/comm/mpi_environment.hpp"
#include "zest/einsum/einsum.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/plan/explain.hpp"
#include "zest/tensor/redistribute.hpp"

#if !ZEST_HAS_BLAS
#error "sharded_einsum compares against OpenBLAS: build with -DZEST_HAS_BLAS=1 -lopenblas"
#endif

namespace {

using mesh_t = zest::mesh<"dp">;
using x_t = zest::tensor<float, mesh_t, "bsm", zest::layout<zest::split<'b', "dp">>>;
using w_t = zest::tensor<float, mesh_t, "mh", zest::layout<zest::split<'m', "dp">>>;
using y_t = zest::tensor<float, mesh_t, "bsh", zest::layout<zest::split<'b', "dp">>>;

// The plan this bench is about: w all-gathered, x kept, y split(b:dp).
constexpr auto plan = zest::einsum_plan_of<"bsm,mh->bsh", void, void, x_t, w_t>;
static_assert(plan.collectives() == 1 && plan.operand_steps[0].size() == 0 &&
              plan.operand_steps[1][0].kind == zest::step_kind::all_gather);
static_assert(plan.result == y_t::layout);

// Seconds of f() on the slowest rank, all ranks starting together.
double timed(const std::function<void()>& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  f();
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct series {
  const char* name;
  std::function<void()> run;
  std::vector<double> times{};
};

// Warms each series up, then runs rounds of all of them, alternating the order, for at least
// `min_rounds` rounds and `budget_s` seconds. Rank 0 decides when to stop, for every rank.
void measure(std::span<series> group, int min_rounds, double budget_s) {
  for (auto& c : group) c.run();
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 500; ++round) {
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    int more = round < min_rounds || elapsed.count() < budget_s ? 1 : 0;
    MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (more == 0) return;
    for (std::size_t k = 0; k < group.size(); ++k) {
      auto& c = group[round % 2 == 0 ? k : group.size() - 1 - k];
      c.times.push_back(timed(c.run));
    }
  }
}

// The interquartile mean of the per-round ratios a/b (in logs), as in bench/collectives.cpp:
// each round's two calls ran back to back, so load from other processes mostly cancels.
double paired_ratio(const series& a, const series& b) {
  std::vector<double> logs;
  for (std::size_t i = 0; i < a.times.size(); ++i)
    logs.push_back(std::log(a.times[i] / b.times[i]));
  std::sort(logs.begin(), logs.end());
  const std::size_t drop = logs.size() / 4;
  double sum = 0;
  for (std::size_t i = drop; i < logs.size() - drop; ++i) sum += logs[i];
  return std::exp(sum / double(logs.size() - 2 * drop));
}

}  // namespace

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);
  openblas_set_num_threads(1);
  bool quick = false;
  for (int i = 1; i < argc; ++i) quick = quick || std::string_view(argv[i]) == "--quick";

  mesh_t mesh(MPI_COMM_WORLD, {-1});
  const int ranks = mesh.size(0);
  const bool root = mesh.rank() == 0;
  // Per rank: b*s/ranks rows of x (2048 on 2 ranks), a GEMM of rows x m x h.
  const std::size_t s = 512, m = quick ? 512 : 1024, h = m;
  const std::size_t b = (quick ? 2 : 4) * static_cast<std::size_t>(ranks);
  const int min_rounds = quick ? 8 : 20;
  const double budget_s = quick ? 2 : 15;
  if (m % static_cast<std::size_t>(ranks) != 0) {
    if (root) std::fprintf(stderr, "sharded_einsum: m = %zu must divide over %d ranks\n", m, ranks);
    return 2;
  }

  const auto x = x_t::generate(mesh, {b, s, m}, [](const auto& i) {
    return float((i[0] * 131 + i[1] * 31 + i[2] * 7) % 23) / 23.0F - 0.5F;
  });
  const auto w = w_t::generate(mesh, {m, h}, [](const auto& i) {
    return float((i[0] * 17 + i[1] * 5) % 19) / 19.0F - 0.5F;
  });
  const std::size_t rows = x.local_count() / m;  // local b*s

  // The same work by hand, on the same shards, into buffers allocated once.
  std::vector<float> w_full(m * h), y_manual(rows * h);
  const int shard = static_cast<int>(w.local_count());
  auto gather = [&] {
    MPI_Allgather(w.local().data(), shard, MPI_FLOAT, w_full.data(), shard, MPI_FLOAT,
                  MPI_COMM_WORLD);
  };
  auto sgemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(h), int(m), 1.0F,
                x.local().data(), int(m), w_full.data(), int(h), 0.0F, y_manual.data(), int(h));
  };
  std::vector<float> y_contract(rows * h);
  const auto& x_ext = x.local_extents();
  const std::array<std::size_t, 2> w_ext{m, h};
  const std::array<std::size_t, 3> y_ext{x_ext[0], s, h};
  std::vector<series> all{
      {"zest einsum (total)", [&] { (void)zest::einsum<"bsm,mh->bsh">(x, w); }},
      {"manual: MPI_Allgather + sgemm",
       [&] {
         gather();
         sgemm();
       }},
      {"  zest redistribute w -> replicate", [&] { (void)zest::redistribute<zest::layout<>>(w); }},
      {"  MPI_Allgather of w", gather},
      {"  zest host::contract (local GEMM)",
       [&] {
         const zest::host::operand_view<float> ops[] = {{x.local().data(), "bsm", x_ext},
                                                        {w_full.data(), "mh", w_ext}};
         zest::host::contract<float>(ops, "bsh", y_contract.data(), y_ext);
       }},
      {"  cblas_sgemm", sgemm},
      {"  zest output tensor (zero-filled)",
       [&] {
         (void)y_t(mesh, {b, s, h});
       }},
  };

  // Correctness first: zest's shard equals the manual result, its bytes equal the plan's.
  mesh.reset_stats();
  const auto y = zest::einsum<"bsm,mh->bsh">(x, w);
  const auto counted = mesh.stats().bytes_sent();
  const auto planned = zest::explain<"bsm,mh->bsh">(x, w).bytes();
  gather();
  sgemm();
  float worst = 0;
  for (std::size_t i = 0; i < y_manual.size(); ++i) {
    worst = std::max(worst, std::abs(y.local()[i] - y_manual[i]));
  }
  int bad = (y.local_count() != y_manual.size() || worst > 1e-3F || counted != planned) ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (bad != 0) {
    if (root)
      std::fprintf(
          stderr,
          "sharded_einsum: zest and manual disagree (max diff %g, bytes %llu vs plan %llu)\n",
          double(worst), (unsigned long long)counted, (unsigned long long)planned);
    return 1;
  }
  if (root) std::printf("%s", zest::explain<"bsm,mh->bsh">(x, w).str().c_str());

  // The metric's pair first, alone, then the breakdown.
  measure(std::span(all).first(2), min_rounds, budget_s);
  measure(std::span(all).subspan(2), min_rounds / 2, budget_s / 3);

  if (root) {
    const auto best = [](const series& c) {
      return *std::min_element(c.times.begin(), c.times.end());
    };
    const double gflop = 2.0 * double(rows) * double(m) * double(h) / 1e9;
    std::printf(
        "\nZeRO-3 \"bsm,mh->bsh\" on %s: b=%zu s=%zu m=%zu h=%zu; per rank %zu rows, "
        "%.2f GFLOP, w shard %.2f MiB\n",
        mesh.describe().c_str(), b, s, m, h, rows, gflop, double(shard) * 4 / 1048576.0);
    std::printf("%-36s %10s %10s\n", "series (slowest rank per call)", "median ms", "best ms");
    for (const auto& c : all) {
      std::printf("%-36s %10.3f %10.3f\n", c.name, median(c.times) * 1e3, best(c) * 1e3);
    }
    const double ratio = paired_ratio(all[0], all[1]);
    std::printf(
        "zest / manual: %.3f paired (interquartile mean of %zu rounds), %.3f of medians, "
        "%.3f of bests; zest's extra time %.3f ms (medians); manual %.1f GFLOP/s\n",
        ratio, all[0].times.size(), median(all[0].times) / median(all[1].times),
        best(all[0]) / best(all[1]), (median(all[0].times) - median(all[1].times)) * 1e3,
        gflop / median(all[1].times));
    std::printf("METRIC sharded_einsum_ratio_vs_manual %.4f\n", ratio);
  }
  return 0;
}
