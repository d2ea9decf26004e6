// moe — GShard's Mixture-of-Experts layer on the ranks of one run: the index path's
// dispatch and combine against GShard's one-hot einsums, the layer against a dense FFN of
// the same active FLOPs per token, the share of the all-to-alls, and the expert states per
// rank as experts grow with ranks.
//
//   mpiexec -n 2 ./bench_moe [--quick]      (--quick: 1 group per rank in the dispatch
//                                             case, fewer repetitions, the same sizes)
//
// The mesh is mesh<"dp", "ep"> {1, ranks} (the experts split over "ep"), fp32, ZeRO stage 0
// (one data-parallel replica: the stage changes nothing), one BLAS thread. Times are the
// slowest rank's (or the rank mean where said), medians over repetitions after warmup, the
// two sides of each ratio interleaved so that load from other processes falls on both.
// Prints a table and, on rank 0:
//
//   moe_index_dispatch_speedup_vs_einsum  dispatch + combine, forward + backward, of
//       GShard's one-hot einsums "gsec,gsm->egcm" and "gsec,egcm->gsm" / the index path's
//       dispatch_by_index and combine_by_index, same routing (top-2 gating, capacity factor
//       1.25) and data: S = 1024 tokens per group, E = 8, M = 256, C = 320, 2 groups per
//       rank. Both paths differentiate x and the gates (the combine tensor, or the weights
//       "gsk"); the output gradient is seeded, so no loss op is timed.     target >= 5
//   moe_layer_ratio_vs_dense_ffn  forward + backward (engine.backward, with its gradient
//       collectives) of moe_layer (top-2, E = 8, expert hidden 512, index path, experts
//       split over "ep") / zest::mlp of hidden 2 * 512 = 1024, the same active FLOPs per
//       token, on the same tokens "btm" split<'b', "dp", "ep"> (2048 per rank as 2 sequences
//       of 1024; a sequence is a group), M = 256; loss = sum(y * r) (+ 0.01 aux for the MoE).
//       The experts compute capacity_factor = 1.25 times the active FLOPs (C slots of every
//       expert are multiplied, full or not), so compute alone puts the ratio near 1.25. The
//       two run back to back in pairs (order alternating); the metric is the median of the
//       pairs' ratios (a pair sees one load), the ratio of medians is printed too.
//                                                                            target <= 1.5
//   moe_dropless_ratio_vs_dense_ffn  the same measurement with the layer's dropless path
//       (gating_options::dropless: moe::dropless_experts, each expert computes exactly its
//       routed choices, grouped GEMMs over the concatenated rows), a layer of its own
//       against its own interleaved dense steps. Its experts compute the active FLOPs (less
//       the second choices random routing leaves out), so the ratio's floor is near 1.
//                                                                           target <= 1.15
//   moe_alltoall_share  the fraction of a forward + backward of the MoE layer spent in its
//       four all-to-alls (to the experts and back, forward and backward): the layer's
//       forward rebuilt here from zest/moe/dispatch.hpp's pieces with the layer's own
//       parameters, each piece timed (forward, and backward through marks on the tape
//       around it), rank mean. An all-to-all's time is its packing, exchange and unpacking,
//       plus the time a rank waits for the others before it (a barrier placed there, timed
//       apart: what load from other processes adds); the table shows both parts, and the
//       seconds inside MPI for the all-to-alls: their starts and every poll of their
//       requests (bench/mpi_profile.hpp, the profiling interface).          for the record
//   moe_expert_bytes_per_rank_ratio  bytes of the expert parameters' states per rank
//       (stored copy, gradient buffer, Adam's m and v: what zest's allocation count sees
//       around constructing them) with E = 4 on 2 ranks / with E = 8 on 4 ranks (mesh
//       {1, 2} and {1, 4}: the experts grow with the ranks).                 target 1.0
//
// Only the world size's case can be allocated in one run: with R ranks, E = 2 R is
// constructed and measured (live bytes around the four expert parameters of the layer's
// types), and both sides of the ratio are also computed from the same parameter types'
// layouts on a zest::mesh_shape of 2 and of 4 ranks, each rank's block from dim_range as
// the ZeRO planner counts it. The ratio takes the measurement for the side this run has the
// ranks for (R = 2 by default; with ZEST_BENCH_NPROCS=4, bench/run measures the 4-rank side)
// and the layouts for the other; the layout count of the measured case is printed next to
// the measurement, which it must equal.
//
// Also printed, to tell the layer's own costs from a shared machine's: the layer and dense
// steps in CPU seconds (rank mean; not stretched when other processes take the cores) and
// their minor page faults, each piece's CPU seconds and page faults, and one bare
// MPI_Alltoall of the same bytes (warm buffers) after each rebuilt step.
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpi_profile.hpp"  // defines the MPI calls zest makes: include once
#include "zest/comm/mpi_environment.hpp"
#include "zest/core/memory.hpp"
#include "zest/core/random.hpp"
#include "zest/layout/shard.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/mesh/mesh_shape.hpp"
#include "zest/moe/moe_layer.hpp"
#include "zest/nn/mlp.hpp"

#if ZEST_HAS_BLAS
#include <cblas.h>
#endif

namespace {

namespace ad = zest::autodiff;
namespace moe = zest::moe;
using clock_type = std::chrono::steady_clock;

using mesh_t = zest::mesh<"dp", "ep">;
using policy = zest::training_policy<mesh_t, zest::zero_stage<0>, float>;
using layer_t = moe::moe_layer<policy>;
using seq_tokens = zest::layout<zest::split<'b', "dp", "ep">>;  // a sequence is a group
using group_tokens = zest::layout<zest::split<'g', "dp", "ep">>;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}
// CPU seconds this process has used: not stretched when other processes take the cores
// (polling inside MPI counts, though).
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
// Minor page faults of this process so far: fresh memory touched for the first time.
double minor_page_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_minflt);
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
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A value in [-1, 1) of (seed, global flat index): the same on every rank count.
double uniform(std::uint64_t seed, std::uint64_t i) {
  return static_cast<double>(zest::splitmix64(zest::splitmix64(seed) ^ i) >> 11) * 0x1p-52 - 1;
}
template <class X>
X random_tensor(const mesh_t& m, const typename X::extents_type& e, std::uint64_t seed,
                double scale = 1) {
  return X::generate(m, e, [&](const typename X::extents_type& i) {
    std::uint64_t flat = 0;
    for (std::size_t k = 0; k < i.size(); ++k) flat = flat * e[k] + i[k];
    return scale * uniform(seed, flat);
  });
}

// Largest |a - b| over the largest |b|, over the whole tensors (collective).
template <class A, class B>
double relative_difference(const A& a, const B& b) {
  const auto ga = zest::to_global(a), gb = zest::to_global(b);
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < gb.size(); ++i) {
    worst = std::max(worst, std::abs(double(ga[i]) - double(gb[i])));
    scale = std::max(scale, std::abs(double(gb[i])));
  }
  return scale > 0 ? worst / scale : worst;
}

struct settings {
  // dispatch + combine
  std::size_t d_groups_per_rank = 2, d_tokens = 1024, d_experts = 8, d_width = 256;
  int d_warmup = 1, d_reps = 7;
  // the layer
  std::size_t seqs_per_rank = 2, seq_len = 1024, width = 256, expert_hidden = 512;
  std::size_t experts = 8;
  int l_warmup = 2, l_reps = 15;  // pairs (MoE, dense), order alternating
  int p_reps = 7;                 // pipeline breakdown
};

// ---------------------------------------------------------------------------------------
// Dispatch + combine: the einsum path against the index path.

struct path_times {
  std::vector<double> forward, backward, total;  // slowest rank's, per repetition
  void add(double f, double b) {
    forward.push_back(max_over_ranks(f));
    backward.push_back(max_over_ranks(b));
    total.push_back(max_over_ranks(f + b));
  }
};

struct dispatch_figures {
  path_times einsum, index;
  std::size_t capacity = 0;
  double kept_fraction = 0;
  double value_difference = 0, dx_difference = 0;
};

dispatch_figures bench_dispatch(const mesh_t& m, const settings& s) {
  using logits_t = zest::tensor<float, mesh_t, "gse", group_tokens>;
  using x_t = zest::tensor<float, mesh_t, "gsm", group_tokens>;
  const std::size_t ranks = static_cast<std::size_t>(m.world_size());
  const std::size_t G = s.d_groups_per_rank * ranks, S = s.d_tokens, E = s.d_experts, M = s.d_width;

  // The routing: GShard top-2 of random logits, decided once.
  ad::tape route_tape;
  auto logits = route_tape.constant(random_tensor<logits_t>(m, {G, S, E}, 1, 2.0));
  auto r = moe::top2_gating(logits, {.top_k = 2, .capacity_factor = 1.25, .seed = 7});
  const std::size_t C = r.capacity;
  const auto dispatch = r.dispatch;
  const auto combine = r.combine.value();
  const auto weight = r.weight.value();
  const auto& ei = r.expert_index;
  const auto& si = r.slot_index;
  const x_t x0 = random_tensor<x_t>(m, {G, S, M}, 2);
  const x_t dz0 = random_tensor<x_t>(m, {G, S, M}, 3);

  dispatch_figures f;
  f.capacity = C;
  {
    double kept = 0;
    for (auto k : r.stats.kept_per_expert) kept += static_cast<double>(k);
    f.kept_fraction = mean_over_ranks(kept / static_cast<double>(r.stats.assignments));
  }

  // One forward and backward of a path; returns (forward s, backward s) and keeps the last
  // output and input gradient for the comparison.
  std::optional<x_t> z_index, z_einsum, dx_index, dx_einsum;
  auto seed = [&](const auto& z) {
    using z_t = typename std::remove_cvref_t<decltype(z)>::tensor_type;
    static_assert(std::is_same_v<ad::dual_tensor<z_t>, x_t>);
    z.node()->grad.emplace(dz0);
  };
  auto run_index = [&] {
    ad::tape t;
    auto x = t.parameter(x_t(x0));
    auto w = t.parameter(std::remove_cvref_t<decltype(weight)>(weight));
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = clock_type::now();
    auto d = moe::dispatch_by_index(x, ei, si, E, C);
    auto z = moe::combine_by_index(d, w, ei, si);
    const double forward = seconds_since(t0);
    seed(z);
    const auto t1 = clock_type::now();
    t.run_backward();
    const double backward = seconds_since(t1);
    z_index.emplace(z.value());
    dx_index.emplace(x.grad());
    return std::pair{forward, backward};
  };
  auto run_einsum = [&] {
    ad::tape t;
    auto x = t.parameter(x_t(x0));
    auto disp = t.constant(std::remove_cvref_t<decltype(dispatch)>(dispatch));
    auto comb = t.parameter(std::remove_cvref_t<decltype(combine)>(combine));
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = clock_type::now();
    auto d = ad::einsum<"gsec,gsm->egcm">(disp, x);
    auto z = ad::einsum<"gsec,egcm->gsm">(comb, d);
    const double forward = seconds_since(t0);
    seed(z);
    const auto t1 = clock_type::now();
    t.run_backward();
    const double backward = seconds_since(t1);
    z_einsum.emplace(z.value());
    dx_einsum.emplace(x.grad());
    return std::pair{forward, backward};
  };

  for (int i = 0; i < s.d_warmup; ++i) {
    run_index();
    run_einsum();
  }
  for (int i = 0; i < s.d_reps; ++i) {
    for (int side = 0; side < 2; ++side) {
      if ((side == 0) == (i % 2 == 0)) {
        const auto [fw, bw] = run_index();
        f.index.add(fw, bw);
      } else {
        const auto [fw, bw] = run_einsum();
        f.einsum.add(fw, bw);
      }
    }
  }
  f.value_difference = relative_difference(*z_index, *z_einsum);
  f.dx_difference = relative_difference(*dx_index, *dx_einsum);
  return f;
}

// ---------------------------------------------------------------------------------------
// The layer against a dense FFN of the same active FLOPs per token.

using x_btm = zest::tensor<float, mesh_t, "btm", seq_tokens>;
using r_btm = zest::tensor<float, mesh_t, "btm">;

struct layer_figures {
  std::vector<double> moe, dense, pair_ratio;    // seconds (slowest rank), per repetition
  std::vector<double> moe_cpu, dense_cpu;        // CPU seconds (rank mean), per repetition
  std::vector<double> moe_faults, dense_faults;  // minor page faults (rank mean)
  double kept_fraction = 0;
  std::size_t capacity = 0;
  std::uint64_t all_to_all_bytes = 0;  // sent per rank per step (the layer's formula)
};

// One forward + backward of `f` on x, with the engine's group in scope: the slowest rank's
// seconds, and the rank means of CPU seconds and minor page faults.
struct step_sample {
  double seconds = 0, cpu = 0, faults = 0;
};
template <class Engine, class F>
step_sample timed_step(Engine& engine, std::size_t group, const x_btm& x0, const r_btm& r0, F&& f) {
  ad::tape t;
  auto x = t.parameter(x_btm(x0));
  auto r = t.constant(r_btm(r0));
  MPI_Barrier(MPI_COMM_WORLD);
  const double faults0 = minor_page_faults();
  const double cpu0 = cpu_seconds();
  const auto t0 = clock_type::now();
  auto loss = [&] {
    auto in_scope = engine.use(t, group);
    return f(x, r);
  }();
  engine.backward(loss);
  const double wall = seconds_since(t0), cpu = cpu_seconds() - cpu0;
  const double faults = minor_page_faults() - faults0;
  return {max_over_ranks(wall), mean_over_ranks(cpu), mean_over_ranks(faults)};
}

// `layer` (in the engine's group `group`) against the dense FFN's step: l_reps pairs back to
// back, the order alternating, after l_warmup pairs; the routing of the last step.
template <class Engine, class DenseStep>
layer_figures layer_against_dense(Engine& engine, std::size_t group, const layer_t& layer,
                                  const x_btm& x0, const r_btm& r0, const settings& s,
                                  DenseStep&& dense_step) {
  layer_figures lf;
  std::uint64_t step = 0;
  auto moe_step = [&] {
    return timed_step(engine, group, x0, r0, [&](const auto& x, const auto& r) {
      auto y = layer(x, step++);
      return ad::sum(y * r) + ad::scale(layer.aux_loss(), 0.01F);
    });
  };
  for (int i = 0; i < s.l_warmup; ++i) {
    moe_step();
    dense_step();
  }
  for (int i = 0; i < s.l_reps; ++i) {
    step_sample a, b;
    if (i % 2 == 0) {
      a = moe_step();
      b = dense_step();
    } else {
      b = dense_step();
      a = moe_step();
    }
    lf.moe.push_back(a.seconds);
    lf.dense.push_back(b.seconds);
    lf.pair_ratio.push_back(a.seconds / b.seconds);
    lf.moe_cpu.push_back(a.cpu);
    lf.dense_cpu.push_back(b.cpu);
    lf.moe_faults.push_back(a.faults);
    lf.dense_faults.push_back(b.faults);
  }
  double kept = 0;
  for (auto k : layer.stats().kept_per_expert) kept += static_cast<double>(k);
  lf.kept_fraction = mean_over_ranks(kept / static_cast<double>(layer.stats().assignments));
  lf.capacity = layer.capacity();
  lf.all_to_all_bytes = layer.last_all_to_all().step();
  return lf;
}

// ---------------------------------------------------------------------------------------
// The layer's forward rebuilt from dispatch.hpp's pieces, each timed.

enum piece : std::size_t {
  routing,
  dispatch,
  wait_to_experts,
  to_experts,
  experts,
  wait_to_tokens,
  to_tokens,
  combine,
  pieces
};
constexpr std::array<const char*, pieces> piece_names{"routing (gate einsum, top-2)",
                                                      "dispatch_by_index",
                                                      "  wait for the other ranks",
                                                      "all-to-all to experts",
                                                      "experts (2 einsums, GELU)",
                                                      "  wait for the other ranks",
                                                      "all-to-all back",
                                                      "combine_by_index"};

// Wall and CPU seconds and minor page faults at once: the CPU seconds of a piece are not
// stretched when other processes take the core (a wait inside MPI polls, so it counts).
struct moment {
  clock_type::time_point wall = clock_type::now();
  double cpu = cpu_seconds();
  double faults = minor_page_faults();
};
struct span_time {
  double wall = 0, cpu = 0, faults = 0;
  void add_since(const moment& m) {
    wall += seconds_since(m.wall);
    cpu += cpu_seconds() - m.cpu;
    faults += minor_page_faults() - m.faults;
  }
};

struct piece_clock {
  std::array<span_time, pieces> forward{}, backward{};
  std::array<moment, pieces> started{};
};

// f()'s forward time, and its backward's: a mark recorded before f's steps runs after their
// backward, one recorded after them runs before.
template <class F>
auto timed_piece(ad::tape& t, piece_clock& c, piece p, F&& f) {
  t.record([&c, p] { c.backward[p].add_since(c.started[p]); });
  const moment t0;
  auto out = f();
  c.forward[p].add_since(t0);
  t.record([&c, p] { c.started[p] = moment{}; });
  return out;
}

// A barrier before an all-to-all, forward and backward (recorded after the all-to-all, so
// that backward meets it just before the all-to-all's own backward): the time a rank waits
// there for the others is what the all-to-all would otherwise spend waiting, which load
// from other processes and uneven work cause, not the exchange.
template <class F>
auto synced_all_to_all(ad::tape& t, piece_clock& c, piece wait, piece exchange, F&& f) {
  const moment t0;
  MPI_Barrier(MPI_COMM_WORLD);
  c.forward[wait].add_since(t0);
  auto out = timed_piece(t, c, exchange, std::forward<F>(f));
  t.record([&c, wait] {
    const moment t1;
    MPI_Barrier(MPI_COMM_WORLD);
    c.backward[wait].add_since(t1);
  });
  return out;
}

struct pipeline_figures {
  // rank mean, per repetition
  std::array<std::vector<double>, pieces> forward, backward, forward_cpu, backward_cpu, faults;
  std::vector<double> total, total_cpu, share, exchange_share, mpi;
  std::vector<double> raw_alltoall;  // one bare MPI_Alltoall of the same bytes (slowest rank)
  std::size_t block_bytes = 0;       // the local "egcm" block on the token side
};

template <class Engine>
pipeline_figures bench_pipeline(Engine& engine, std::size_t group, const layer_t& layer,
                                const x_btm& x0, const r_btm& r0, const settings& s, int warmup) {
  pipeline_figures out;
  const std::size_t E = layer.experts();
  std::size_t block = 0;  // elements of the local dispatched block
  std::vector<float> send, recv;
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (int rep = 0; rep < warmup + s.p_reps; ++rep) {
    piece_clock c;
    const double mpi0 = bench_mpi::seconds(bench_mpi::op::all_to_all);
    ad::tape t;
    auto x = t.parameter(x_btm(x0));
    auto rr = t.constant(r_btm(r0));
    MPI_Barrier(MPI_COMM_WORLD);
    const moment t0;
    auto loss = [&] {
      auto in_scope = engine.use(t, group);
      moe::gating_options o = layer.options();
      o.seed = static_cast<std::uint64_t>(rep);
      // As moe_layer::forward (zest/moe/moe_layer.hpp), on the index path.
      auto xg = ad::relabel<"gsm">(x);
      using tokens_t = typename decltype(xg)::tensor_type;
      using dispatched_t = zest::basic_tensor<float, mesh_t, "egcm", tokens_t::layout>;
      auto r = timed_piece(t, c, routing, [&] {
        return moe::gating(ad::einsum<"gsm,me->gse">(xg, layer.gate().value()), o);
      });
      auto d = timed_piece(t, c, dispatch, [&] {
        return moe::dispatch_by_index(xg, r.expert_index, r.slot_index, E, r.capacity);
      });
      block = d.value().local_count();
      auto h = synced_all_to_all(t, c, wait_to_experts, to_experts,
                                 [&] { return moe::to_expert_layout<"ep">(d); });
      auto y = timed_piece(t, c, experts, [&] {
        return moe::expert_feed_forward(h, layer.in_weight().value(), layer.in_bias().value(),
                                        layer.out_weight().value(), layer.out_bias().value());
      });
      auto back = synced_all_to_all(t, c, wait_to_tokens, to_tokens,
                                    [&] { return moe::to_token_layout<dispatched_t::layout>(y); });
      auto z = timed_piece(t, c, combine, [&] {
        return moe::combine_by_index(back, r.weight, r.expert_index, r.slot_index);
      });
      auto out = ad::relabel<"btm">(z);
      return ad::sum(out * rr) + ad::scale(r.aux_loss, 0.01F);
    }();
    engine.backward(loss);
    span_time total;
    total.add_since(t0);
    const double mpi = bench_mpi::seconds(bench_mpi::op::all_to_all) - mpi0;
    // The reference: the same bytes through one bare MPI_Alltoall, warm buffers, after a
    // barrier (the profiling wrapper bypassed).
    const int count = static_cast<int>(block / static_cast<std::size_t>(world));
    send.resize(block, 1.0F);
    recv.resize(block);
    MPI_Barrier(MPI_COMM_WORLD);
    const auto r0 = clock_type::now();
    PMPI_Alltoall(send.data(), count, MPI_FLOAT, recv.data(), count, MPI_FLOAT, MPI_COMM_WORLD);
    const double raw = max_over_ranks(seconds_since(r0));
    if (rep < warmup) continue;
    out.raw_alltoall.push_back(raw);
    out.block_bytes = block * sizeof(float);
    for (std::size_t p = 0; p < pieces; ++p) {
      out.forward[p].push_back(mean_over_ranks(c.forward[p].wall));
      out.backward[p].push_back(mean_over_ranks(c.backward[p].wall));
      out.forward_cpu[p].push_back(mean_over_ranks(c.forward[p].cpu));
      out.backward_cpu[p].push_back(mean_over_ranks(c.backward[p].cpu));
      out.faults[p].push_back(mean_over_ranks(c.forward[p].faults + c.backward[p].faults));
    }
    double a2a = 0, exchange = 0;
    for (piece p : {wait_to_experts, to_experts, wait_to_tokens, to_tokens}) {
      a2a += c.forward[p].wall + c.backward[p].wall;
    }
    for (piece p : {to_experts, to_tokens}) exchange += c.forward[p].wall + c.backward[p].wall;
    out.total.push_back(mean_over_ranks(total.wall));
    out.total_cpu.push_back(mean_over_ranks(total.cpu));
    out.share.push_back(mean_over_ranks(a2a / total.wall));
    out.exchange_share.push_back(mean_over_ranks(exchange / total.wall));
    out.mpi.push_back(mean_over_ranks(mpi));
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Expert states per rank.

// Bytes of a parameter of type Param with global `extents` on the rank at `shape`'s
// coordinates, from its layouts: stored copy, gradient buffer, Adam's m and v, and the fp32
// master where the policy keeps one apart (what zest::parameter allocates).
template <class Param, class Shape>
std::uint64_t state_bytes_from_layouts(const Shape& shape,
                                       const typename Param::extents_type& extents) {
  using P = policy;
  auto held = [&](const zest::layout_value& v) {
    std::uint64_t n = 1;
    for (std::size_t i = 0; i < extents.size(); ++i) {
      n *= zest::dim_range(v, Param::dims[i], extents[i], shape.sizes(), shape.coords()).size;
    }
    return n;
  };
  std::uint64_t bytes = held(Param::layouts.stored) * sizeof(typename P::param_type) +
                        held(Param::layouts.gradient_buffer) * sizeof(typename P::grad_type) +
                        2 * held(Param::layouts.optimizer_state) * sizeof(float);
  if constexpr (P::has_master) bytes += held(Param::layouts.master) * sizeof(float);
  return bytes;
}

// The four expert parameters of moe_layer<Policy> (E experts, M, H): the largest rank's
// bytes over every rank of a mesh of `sizes`, and whether every rank holds the same.
template <class Layer>
std::pair<std::uint64_t, bool> expert_bytes_from_layouts(std::array<int, 2> sizes, std::size_t E,
                                                         std::size_t M, std::size_t H) {
  std::uint64_t most = 0, least = ~std::uint64_t{0};
  for (int a = 0; a < sizes[0]; ++a) {
    for (int b = 0; b < sizes[1]; ++b) {
      const zest::mesh_shape<"dp", "ep"> shape(sizes, {a, b});
      const std::uint64_t bytes =
          state_bytes_from_layouts<typename Layer::in_weight_type>(shape, {E, M, H}) +
          state_bytes_from_layouts<typename Layer::in_bias_type>(shape, {E, H}) +
          state_bytes_from_layouts<typename Layer::out_weight_type>(shape, {E, H, M}) +
          state_bytes_from_layouts<typename Layer::out_bias_type>(shape, {E, M});
      most = std::max(most, bytes);
      least = std::min(least, bytes);
    }
  }
  return {most, most == least};
}

// The same four parameters constructed on the mesh: zest's live bytes around them (the
// largest rank's), and the sum of their local tensors' sizes as a cross-check.
std::pair<std::uint64_t, std::uint64_t> expert_bytes_measured(const mesh_t& m, std::size_t E,
                                                              std::size_t M, std::size_t H) {
  zest::zero_engine<policy> engine(m, {.seed = 3});
  (void)engine.begin_group("experts");
  const std::int64_t before = zest::memory::live_bytes();
  layer_t::in_weight_type w_in(engine, "moe.experts.fc.weight", {E, M, H},
                               zest::init::normal{0.02});
  layer_t::in_bias_type b_in(engine, "moe.experts.fc.bias", {E, H}, zest::init::constant{0.0},
                             false);
  layer_t::out_weight_type w_out(engine, "moe.experts.proj.weight", {E, H, M},
                                 zest::init::normal{0.02});
  layer_t::out_bias_type b_out(engine, "moe.experts.proj.bias", {E, M}, zest::init::constant{0.0},
                               false);
  const std::int64_t live = zest::memory::live_bytes() - before;
  engine.end_group();
  auto tensors = [](auto& p) {
    return p.stored_elements() * sizeof(float) + p.gradient_buffer().size() * sizeof(float) +
           (p.adam_m().size() + p.adam_v().size()) * sizeof(float);
  };
  const std::uint64_t counted = tensors(w_in) + tensors(b_in) + tensors(w_out) + tensors(b_out);
  return {static_cast<std::uint64_t>(max_over_ranks(static_cast<double>(live))),
          static_cast<std::uint64_t>(max_over_ranks(static_cast<double>(counted)))};
}

}  // namespace

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);
#if ZEST_HAS_BLAS
  openblas_set_num_threads(1);
#endif
  bool quick = false;
  for (int i = 1; i < argc; ++i) quick = quick || std::string_view(argv[i]) == "--quick";

  try {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const mesh_t m(MPI_COMM_WORLD, {1, world});
    const bool root = m.rank() == 0;
    const auto ranks = static_cast<std::size_t>(world);
    settings s;
    if (quick) {
      // Fewer groups and repetitions, the same layer: with shorter sequences the experts'
      // GEMMs shrink and fixed costs weigh more, and the layer ratio would not be the one
      // the target speaks of.
      s.d_groups_per_rank = 1;
      s.d_reps = 3;
      s.l_warmup = 1;
      s.l_reps = 5;
      s.p_reps = 3;
    }
    if (s.experts % ranks != 0) {
      throw zest::shape_error(zest::detail::message(
          "bench_moe: E = ", s.experts, " experts do not divide over ", world, " ranks"));
    }

    // ---- dispatch + combine ---------------------------------------------------------------
    const dispatch_figures df = bench_dispatch(m, s);
    // The dispatch case's one-hot tensors are large and of sizes the layer never asks for:
    // give the block cache back so that the layer's own sizes find room in it.
    zest::memory::release_cache();
    // Both paths must compute the same numbers, or the comparison means nothing.
    if (!(df.value_difference < 1e-5 && df.dx_difference < 1e-5)) {
      throw std::runtime_error(zest::detail::message("the einsum and index paths differ: output ",
                                                     df.value_difference, ", gradient ",
                                                     df.dx_difference, " (relative)"));
    }

    // ---- the layer and the dense FFN --------------------------------------------------------
    const std::size_t B = s.seqs_per_rank * ranks, T = s.seq_len, M = s.width, H = s.expert_hidden,
                      E = s.experts;
    const moe::gating_options gating{.top_k = 2, .capacity_factor = 1.25};
    zest::zero_engine<policy> engine(m, {.seed = 1});
    const std::size_t moe_group = engine.begin_group("moe");
    const layer_t layer(engine, "moe", M, H, E, gating, /*index_path=*/true);
    engine.end_group();
    const std::size_t dropless_group = engine.begin_group("dropless");
    moe::gating_options dropless_gating = gating;
    dropless_gating.dropless = true;
    const layer_t dropless(engine, "dropless", M, H, E, dropless_gating, /*index_path=*/true);
    engine.end_group();
    const std::size_t dense_group = engine.begin_group("dense");
    const zest::mlp<policy> dense(engine, "dense", M, gating.top_k * H);
    engine.end_group();
    const x_btm x0 = random_tensor<x_btm>(m, {B, T, M}, 11);
    const r_btm r0 = random_tensor<r_btm>(m, {B, T, M}, 12, 1e-2);

    auto dense_step = [&] {
      return timed_step(engine, dense_group, x0, r0,
                        [&](const auto& x, const auto& r) { return ad::sum(dense(x) * r); });
    };
    const layer_figures lf = layer_against_dense(engine, moe_group, layer, x0, r0, s, dense_step);
    const layer_figures dl =
        layer_against_dense(engine, dropless_group, dropless, x0, r0, s, dense_step);

    // ---- where the layer's time goes -------------------------------------------------------
    const pipeline_figures pf = bench_pipeline(engine, moe_group, layer, x0, r0, s, 1);

    // ---- expert states per rank ----------------------------------------------------------
    // Measured: E = 2 R on this run's R ranks. Computed from layouts: the same, and the
    // other side of the ratio (E = 8 on 4 ranks, or E = 4 on 2 ranks when R = 4).
    const std::size_t e_here = 2 * ranks;
    const auto [measured, counted] = expert_bytes_measured(m, e_here, M, H);
    const auto [layout_here, even_here] =
        expert_bytes_from_layouts<layer_t>({1, world}, e_here, M, H);
    const auto [layout_2, even_2] = expert_bytes_from_layouts<layer_t>({1, 2}, 4, M, H);
    const auto [layout_4, even_4] = expert_bytes_from_layouts<layer_t>({1, 4}, 8, M, H);
    // For the record: E = 8 on 2 x 2 ranks under ZeRO-3 (two replicas of 2 expert ranks; the
    // stage partitions each expert block over "dp").
    using layer3_t = moe::moe_layer<zest::training_policy<mesh_t, zest::zero_stage<3>, float>>;
    const auto [layout_zero3, even_zero3] = expert_bytes_from_layouts<layer3_t>({2, 2}, 8, M, H);
    // The ratio: the measurement where this run has the ranks, the layouts elsewhere.
    const double bytes_2 = static_cast<double>(world == 2 ? measured : layout_2);
    const double bytes_4 = static_cast<double>(world == 4 ? measured : layout_4);

    // ---- report ----------------------------------------------------------------------------
    if (root) {
      const double ei_f = median(df.einsum.forward), ei_b = median(df.einsum.backward),
                   ei_t = median(df.einsum.total);
      const double ix_f = median(df.index.forward), ix_b = median(df.index.backward),
                   ix_t = median(df.index.total);
      std::printf("moe: %d ranks, mesh<dp=1, ep=%d>, fp32, one BLAS thread%s\n", world, world,
                  quick ? " (--quick)" : "");
      std::printf(
          "\ndispatch + combine: S = %zu tokens per group, %zu groups per rank, E = %zu, "
          "M = %zu, top-2, capacity factor 1.25 -> C = %zu (%.1f%% of choices kept);\n"
          "forward + backward (x and gates), slowest rank, median of %d after %d "
          "warmup\n",
          s.d_tokens, s.d_groups_per_rank, s.d_experts, s.d_width, df.capacity,
          100 * df.kept_fraction, s.d_reps, s.d_warmup);
      std::printf("  %-34s %10s %10s %10s\n", "path", "fwd ms", "bwd ms", "total ms");
      std::printf("  %-34s %10.2f %10.2f %10.2f\n", "einsum (one-hot gsec)", 1e3 * ei_f, 1e3 * ei_b,
                  1e3 * ei_t);
      std::printf("  %-34s %10.3f %10.3f %10.3f\n", "index (dispatch/combine_by_index)", 1e3 * ix_f,
                  1e3 * ix_b, 1e3 * ix_t);
      std::printf("  %-34s %10.1f %10.1f %10.1f\n", "einsum / index", ei_f / ix_f, ei_b / ix_b,
                  ei_t / ix_t);
      std::printf("  the paths agree: output %.1e, input gradient %.1e (relative)\n",
                  df.value_difference, df.dx_difference);

      const double tokens = static_cast<double>(B * T) / world;  // per rank
      const double dense_flops = 3 * 2 * tokens * 2 * double(M) * double(2 * H);
      const double gate_flops = 3 * 2 * tokens * double(M) * double(E);
      std::printf(
          "\nlayer forward + backward: %zu tokens per rank (%zu sequences of %zu), "
          "M = %zu; slowest rank, median of %d pairs after %d warmup, each path against "
          "its own dense steps\n",
          static_cast<std::size_t>(tokens), B / ranks, T, M, s.l_reps, s.l_warmup);
      std::printf("  %-44s %9s %12s %9s\n", "layer", "ms", "GFLOP/rank", "GFLOP/s");
      // rows: the expert rows computed per rank (E C slots, or the kept choices)
      auto report = [&](const char* name, const layer_figures& f, double rows) {
        const double expert_flops = 3 * 2 * rows * 2 * double(M) * double(H);
        const double moe_t = median(f.moe), dense_t = median(f.dense);
        std::printf("  %-44s %9.2f %12.3f %9.2f\n", name, 1e3 * moe_t,
                    1e-9 * (expert_flops + gate_flops), 1e-9 * (expert_flops + gate_flops) / moe_t);
        std::printf(
            "    (C = %zu, %.1f%% of choices kept; all-to-all %.2f MB sent per rank and "
            "step)\n",
            f.capacity, 100 * f.kept_fraction, 1e-6 * double(f.all_to_all_bytes));
        std::printf("  %-44s %9.2f %12.3f %9.2f\n", "zest::mlp hidden 1024 (same active FLOPs)",
                    1e3 * dense_t, 1e-9 * dense_flops, 1e-9 * dense_flops / dense_t);
        std::printf(
            "  MoE / dense: %.3f (median of the pairs' ratios; ratio of medians %.3f; "
            "per pair:",
            median(f.pair_ratio), moe_t / dense_t);
        for (double r : f.pair_ratio) std::printf(" %.2f", r);
        std::printf("); the FLOPs alone: %.3f\n", (expert_flops + gate_flops) / dense_flops);
        std::printf("  in CPU time (rank mean, medians): MoE %.2f ms, dense %.2f ms: %.3f\n",
                    1e3 * median(f.moe_cpu), 1e3 * median(f.dense_cpu),
                    median(f.moe_cpu) / median(f.dense_cpu));
        std::printf("  minor page faults per step (rank mean, medians): MoE %.0f, dense %.0f\n",
                    median(f.moe_faults), median(f.dense_faults));
      };
      report("moe_layer top-2, E = 8, expert hidden 512", lf,
             static_cast<double>(E * (B / ranks) * lf.capacity));
      report("the same, dropless", dl, tokens * 2 * dl.kept_fraction);

      std::printf(
          "\nwhere the MoE layer's time goes (its forward rebuilt from dispatch.hpp's "
          "pieces, the layer's parameters; rank mean, median of %d)\n",
          s.p_reps);
      std::printf("  %-30s %8s %8s %8s %7s %8s %7s\n", "piece", "fwd ms", "bwd ms", "sum ms",
                  "share", "CPU ms", "faults");
      const double total = median(pf.total), total_cpu = median(pf.total_cpu);
      double pieces_sum = 0, pieces_cpu = 0;
      for (std::size_t p = 0; p < pieces; ++p) {
        const double fw = median(pf.forward[p]), bw = median(pf.backward[p]);
        const double cpu = median(pf.forward_cpu[p]) + median(pf.backward_cpu[p]);
        pieces_sum += fw + bw;
        pieces_cpu += cpu;
        std::printf("  %-30s %8.2f %8.2f %8.2f %6.1f%% %8.2f %7.0f\n", piece_names[p], 1e3 * fw,
                    1e3 * bw, 1e3 * (fw + bw), 100 * (fw + bw) / total, 1e3 * cpu,
                    median(pf.faults[p]));
      }
      std::printf("  %-30s %8s %8s %8.2f %6.1f%% %8.2f\n", "rest (loss, aux, engine)", "", "",
                  1e3 * (total - pieces_sum), 100 * (total - pieces_sum) / total,
                  1e3 * (total_cpu - pieces_cpu));
      std::printf("  %-30s %8s %8s %8.2f %7s %8.2f\n", "total", "", "", 1e3 * total, "",
                  1e3 * total_cpu);
      std::printf(
          "  all-to-all share %.3f (without the waits %.3f); inside MPI for the all-to-alls "
          "(their starts and polls) %.2f ms per step (4 calls)\n",
          median(pf.share), median(pf.exchange_share), 1e3 * median(pf.mpi));
      std::printf("  one bare MPI_Alltoall of the same %.2f MB block (warm buffers): %.2f ms\n",
                  1e-6 * double(pf.block_bytes), 1e3 * median(pf.raw_alltoall));

      std::printf(
          "\nexpert states per rank (stored, gradient buffer, Adam m and v), M = %zu, "
          "expert hidden %zu\n",
          M, H);
      std::printf(
          "  E = %zu on mesh<dp=1, ep=%d>: %llu B measured (live bytes), %llu B in the "
          "local tensors, %llu B from the layouts%s\n",
          e_here, world, static_cast<unsigned long long>(measured),
          static_cast<unsigned long long>(counted), static_cast<unsigned long long>(layout_here),
          even_here ? "" : " (uneven)");
      if (world != 2) {
        std::printf("  E = 4 on mesh<dp=1, ep=2>: %llu B from the layouts%s\n",
                    static_cast<unsigned long long>(layout_2), even_2 ? "" : " (uneven)");
      }
      if (world != 4) {
        std::printf("  E = 8 on mesh<dp=1, ep=4>: %llu B from the layouts%s\n",
                    static_cast<unsigned long long>(layout_4), even_4 ? "" : " (uneven)");
      }
      std::printf("  E = 8 on mesh<dp=2, ep=2>, ZeRO-3: %llu B from the layouts%s\n",
                  static_cast<unsigned long long>(layout_zero3), even_zero3 ? "" : " (uneven)");

      std::printf("\nMETRIC moe_index_dispatch_speedup_vs_einsum %.2f\n", ei_t / ix_t);
      std::printf("METRIC moe_layer_ratio_vs_dense_ffn %.4f\n", median(lf.pair_ratio));
      std::printf("METRIC moe_dropless_ratio_vs_dense_ffn %.4f\n", median(dl.pair_ratio));
      std::printf("METRIC moe_alltoall_share %.4f\n", median(pf.share));
      std::printf("METRIC moe_expert_bytes_per_rank_ratio %.6f\n", bytes_2 / bytes_4);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe: %s\n", e.what());
    return 1;
  }
}
