// bench/collectives.cpp — zest's collectives against raw MPI on the same buffers.
//
//   mpiexec -n 2 ./bench_collectives [--quick] [--mib 16]
//
// For each collective, zest (checked mode off) and the raw MPI call run alternately on the
// same buffers: warm-up, then repetitions in pairs, in alternating order. A sample is a
// burst of calls back to back (time per call, slowest rank, a barrier first). These
// machines are shared and noisy: one call can take 5x the best, as ranks wait for a core.
// A burst averages over several scheduler slices; pairs measured back to back cancel slow
// drift; the interquartile mean of the pairs' time ratios ignores spikes. busbw is reported
// from each side's best sample. S is the full tensor's bytes (16 MiB of float): all_gather
// gathers S, reduce_scatter and all_to_all start from S per rank, all_reduce reduces S.
//
//   algbw = S / t      busbw = algbw * (n-1)/n     (all-gather, reduce-scatter, all-to-all)
//                      busbw = algbw * 2(n-1)/n    (all-reduce)
//
// Rank 0 prints a table and `METRIC <name> <value>` lines: <op>_ratio_vs_mpi (zest busbw /
// MPI busbw, target >= 0.95), <op>_busbw_gbps and <op>_mpi_busbw_gbps.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zest/comm/mpi_communicator.hpp"

namespace {

struct options {
  int reps = 24;
  int burst = 4;  // calls per sample
  int warmup = 2;
  std::size_t mib = 16;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--quick") {
      o.reps = 12;
      o.burst = 3;
      o.warmup = 1;
    } else if (arg == "--mib" && i + 1 < argc) {
      o.mib = std::strtoull(argv[++i], nullptr, 10);
    }
  }
  return o;
}

// The slowest rank's time per call over a burst of calls, after a barrier.
double time_burst(MPI_Comm comm, int burst, const std::function<void()>& call) {
  MPI_Barrier(comm);
  const double start = MPI_Wtime();
  for (int i = 0; i < burst; ++i) call();
  const double mine = (MPI_Wtime() - start) / burst;
  double slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
  return slowest;
}

double best(const std::vector<double>& t) { return *std::min_element(t.begin(), t.end()); }
double median(std::vector<double> t) {
  if (t.empty()) return 0;
  std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

struct result {
  std::string name;
  double bus_factor;
  std::vector<double> zest_times, mpi_times;

  // busbw ratio = time ratio: both sides move the same bytes with the same factor. The
  // interquartile mean of the paired log ratios: as robust to spikes as the median, but it
  // averages the middle half, so it settles with fewer pairs.
  double ratio() const {
    std::vector<double> logs(zest_times.size());
    for (std::size_t i = 0; i < logs.size(); ++i) logs[i] = std::log(mpi_times[i] / zest_times[i]);
    std::sort(logs.begin(), logs.end());
    const std::size_t drop = logs.size() / 4;
    double sum = 0;
    for (std::size_t i = drop; i < logs.size() - drop; ++i) sum += logs[i];
    return std::exp(sum / static_cast<double>(logs.size() - 2 * drop));
  }
};

}  // namespace

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);
  const options opt = parse(argc, argv);
  zest::mpi_communicator world(MPI_COMM_WORLD, "world");
  world.set_checked(false);  // the bench measures the plain path
  MPI_Comm raw = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);

  const std::size_t n = static_cast<std::size_t>(world.size());
  const double nd = static_cast<double>(n);
  const std::size_t total = opt.mib * 1024 * 1024 / sizeof(float) / n * n;  // divisible by n
  const std::size_t chunk = total / n;
  const int total_i = static_cast<int>(total), chunk_i = static_cast<int>(chunk);
  const double bytes = static_cast<double>(total * sizeof(float));

  std::vector<float> full(total, 0.0F), other(total, 0.0F), part(chunk, 0.0F);
  const std::span<const float> full_in(full), part_in(part);
  const std::span<float> full_out(full), other_out(other), part_out(part);

  struct op {
    std::string name;
    double bus_factor;
    std::function<void()> zest_call, mpi_call;
  };
  const std::vector<op> ops = {
      {"allgather", (nd - 1) / nd, [&] { world.all_gather(part_in, other_out); },
       [&] {
         MPI_Allgather(part.data(), chunk_i, MPI_FLOAT, other.data(), chunk_i, MPI_FLOAT, raw);
       }},
      {"reduce_scatter", (nd - 1) / nd, [&] { world.reduce_scatter(full_in, part_out); },
       [&] {
         MPI_Reduce_scatter_block(full.data(), part.data(), chunk_i, MPI_FLOAT, MPI_SUM, raw);
       }},
      {"allreduce", 2 * (nd - 1) / nd, [&] { world.all_reduce(full_out); },
       [&] { MPI_Allreduce(MPI_IN_PLACE, full.data(), total_i, MPI_FLOAT, MPI_SUM, raw); }},
      {"alltoall", (nd - 1) / nd, [&] { world.all_to_all(full_in, {}, other_out, {}); },
       [&] {
         MPI_Alltoall(full.data(), chunk_i, MPI_FLOAT, other.data(), chunk_i, MPI_FLOAT, raw);
       }},
  };

  std::vector<result> results;
  for (const op& o : ops) {
    result r{o.name, o.bus_factor, {}, {}};
    for (int i = 0; i < opt.warmup; ++i) {
      time_burst(raw, opt.burst, o.zest_call);
      time_burst(raw, opt.burst, o.mpi_call);
    }
    for (int i = 0; i < opt.reps; ++i) {
      // Alternate which side goes first, so neither always follows the other.
      if (i % 2 == 0) {
        r.zest_times.push_back(time_burst(raw, opt.burst, o.zest_call));
        r.mpi_times.push_back(time_burst(raw, opt.burst, o.mpi_call));
      } else {
        r.mpi_times.push_back(time_burst(raw, opt.burst, o.mpi_call));
        r.zest_times.push_back(time_burst(raw, opt.burst, o.zest_call));
      }
    }
    results.push_back(std::move(r));
  }

  if (world.rank() == 0) {
    std::printf(
        "collectives: %zu ranks, S = %zu MiB of float, %d pairs; busbw and ms: best "
        "[median]; ratio: interquartile mean of paired mpi/zest times\n",
        n, opt.mib, opt.reps);
    std::printf("%-15s %14s %14s %8s %18s %18s\n", "op", "zest busbw GB/s", "MPI busbw GB/s",
                "ratio", "zest ms", "MPI ms");
    for (const result& r : results) {
      const double zest_t = best(r.zest_times), mpi_t = best(r.mpi_times);
      const double zest_bw = bytes / zest_t * r.bus_factor / 1e9;
      const double mpi_bw = bytes / mpi_t * r.bus_factor / 1e9;
      std::printf("%-15s %14.2f %14.2f %8.3f %8.2f [%7.2f] %8.2f [%7.2f]\n", r.name.c_str(),
                  zest_bw, mpi_bw, r.ratio(), zest_t * 1e3, median(r.zest_times) * 1e3, mpi_t * 1e3,
                  median(r.mpi_times) * 1e3);
    }
    for (const result& r : results) {
      const double zest_t = best(r.zest_times), mpi_t = best(r.mpi_times);
      std::printf("METRIC %s_ratio_vs_mpi %.3f\n", r.name.c_str(), r.ratio());
      std::printf("METRIC %s_busbw_gbps %.3f\n", r.name.c_str(),
                  bytes / zest_t * r.bus_factor / 1e9);
      std::printf("METRIC %s_mpi_busbw_gbps %.3f\n", r.name.c_str(),
                  bytes / mpi_t * r.bus_factor / 1e9);
    }
  }
  MPI_Comm_free(&raw);
  return 0;
}
