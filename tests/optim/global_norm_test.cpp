// zest::global_norm over sharded gradients at 1, 2 and 4 ranks: replicated, split over dp,
// and 2-D (dp x tp) layouts, several element types and several tensors at once, against the
// norm of the global array; the run-time norm_term form; the axis communicators' counters
// untouched (one all_reduce on the world communicator instead). Also clip_coefficient, and
// any_rank with the loss scaler: one rank's inf makes every rank skip the step.
#include <doctest/doctest.h>
#include <mpi.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "support/fixtures.hpp"
#include "support/mpi_test.hpp"
#include "zest/optim/clip.hpp"
#include "zest/optim/loss_scaler.hpp"

namespace {

using namespace zest;
using zest::testing::global_values;
using zest::testing::mesh_shapes;

using mesh1 = mesh<"dp">;
using mesh2 = mesh<"dp", "tp">;

// The global array of tensor type X (value_at rounded to its element type), row-major.
template <class X>
std::vector<typename X::value_type> global_array(const typename X::extents_type& extents,
                                                 std::uint32_t salt) {
  using T = typename X::value_type;
  const auto exact = global_values(extents, salt);
  std::vector<T> out(exact.size());
  for (std::size_t i = 0; i < exact.size(); ++i) out[i] = T(static_cast<float>(exact[i]));
  return out;
}

template <class T>
double squares(const std::vector<T>& values) {
  double s = 0;
  for (const T& x : values) {
    const auto d = static_cast<double>(static_cast<float>(x));
    s += d * d;
  }
  return s;
}

template <class X>
X make(const typename X::mesh_type& m, const typename X::extents_type& extents,
       const std::vector<typename X::value_type>& global) {
  return X::from_global(m, extents, std::span<const typename X::value_type>(global));
}

bool same_counters(const comm_stats& a, const comm_stats& b) {
  for (std::size_t k = 0; k < collective_kinds; ++k) {
    if (a.by_kind[k].calls != b.by_kind[k].calls) return false;
    if (a.by_kind[k].bytes_sent != b.by_kind[k].bytes_sent) return false;
  }
  return true;
}

// global_norm(m, g) for one tensor type, checked against the global array's norm, with the
// counters of the axis communicators unchanged and one all_reduce on the world.
template <class X, class Mesh>
void check_one(const Mesh& m, const typename X::extents_type& extents, std::uint32_t salt) {
  const auto global = global_array<X>(extents, salt);
  const X g = make<X>(m, extents, global);
  const comm_stats axes_before = m.stats();
  const comm_stats world_before = m.world().stats();
  const double norm = global_norm(m, g);
  INFO("mesh " << m.describe() << ", layout " << layout_string<X>() << ", rank " << m.rank());
  CHECK(norm == doctest::Approx(std::sqrt(squares(global))).epsilon(1e-12));
  CHECK(same_counters(m.stats(), axes_before));
  const comm_stats world_delta = m.world().stats() - world_before;
  CHECK(world_delta.calls() == 1);
  CHECK(world_delta[collective::all_reduce].calls == 1);
  // The run-time form agrees exactly (same sums in the same order).
  const std::array<norm_term, 1> terms{norm_term_of(g)};
  CHECK(global_norm(m, std::span<const norm_term>(terms)) == norm);
}

}  // namespace

TEST_CASE("global_norm on a 1-D mesh: replicated and split over dp") {
  mesh1 m(MPI_COMM_WORLD, {-1});
  const std::array<std::size_t, 2> extents{7, 5};  // 7 over 4 ranks is uneven; over 4: 2,2,2,1
  check_one<tensor<float, mesh1, "mh">>(m, extents, 1);
  check_one<tensor<float, mesh1, "mh", layout<split<'m', "dp">>>>(m, extents, 2);
  check_one<tensor<float, mesh1, "mh", layout<split<'h', "dp">>>>(m, extents, 3);
  check_one<tensor<double, mesh1, "mh", layout<split<'m', "dp">>>>(m, extents, 4);
  check_one<tensor<bfloat16, mesh1, "mh", layout<split<'m', "dp">>>>(m, extents, 5);
  check_one<tensor<float16, mesh1, "mh">>(m, extents, 6);
  // More ranks than rows: some ranks hold empty blocks.
  check_one<tensor<float, mesh1, "mh", layout<split<'m', "dp">>>>(m, {2, 3}, 7);
  check_one<tensor<float, mesh1, "m", layout<split<'m', "dp">>>>(m, {1000}, 8);
}

TEST_CASE("global_norm on dp x tp meshes: every kind of 2-D layout") {
  for (const auto& shape : mesh_shapes()) {
    mesh2 m(MPI_COMM_WORLD, shape);
    const std::array<std::size_t, 2> extents{9, 6};
    check_one<tensor<float, mesh2, "mh">>(m, extents, 1);
    check_one<tensor<float, mesh2, "mh", layout<split<'m', "dp">>>>(m, extents, 2);
    check_one<tensor<float, mesh2, "mh", layout<split<'h', "tp">>>>(m, extents, 3);
    check_one<tensor<float, mesh2, "mh", layout<split<'m', "tp">>>>(m, extents, 4);
    check_one<tensor<float, mesh2, "mh", layout<split<'m', "dp">, split<'h', "tp">>>>(m, extents,
                                                                                      5);
    check_one<tensor<float, mesh2, "mh", layout<split<'h', "dp">, split<'m', "tp">>>>(m, extents,
                                                                                      6);
    check_one<tensor<float, mesh2, "mh", layout<split<'m', "dp", "tp">>>>(m, extents, 7);
    check_one<tensor<float, mesh2, "mh", layout<split<'m', "tp", "dp">>>>(m, extents, 8);
    check_one<tensor<bfloat16, mesh2, "mh", layout<split<'m', "dp">, split<'h', "tp">>>>(m, extents,
                                                                                         9);
    check_one<tensor<float16, mesh2, "mh", layout<split<'h', "tp">>>>(m, extents, 10);
    check_one<tensor<float, mesh2, "bsh", layout<split<'b', "dp">, split<'h', "tp">>>>(m, {3, 4, 5},
                                                                                       11);
  }
}

TEST_CASE("global_norm of several gradients at once, and with norm_terms") {
  for (const auto& shape : mesh_shapes()) {
    mesh2 m(MPI_COMM_WORLD, shape);
    using w1_t = tensor<float, mesh2, "mh", layout<split<'m', "dp">, split<'h', "tp">>>;
    using w2_t = tensor<bfloat16, mesh2, "hm", layout<split<'h', "tp">>>;
    using b_t = tensor<float, mesh2, "h">;
    using e_t = tensor<float16, mesh2, "vm", layout<split<'v', "dp", "tp">>>;
    const auto g1 = global_array<w1_t>({8, 12}, 1);
    const auto g2 = global_array<w2_t>({12, 8}, 2);
    const auto g3 = global_array<b_t>({12}, 3);
    const auto g4 = global_array<e_t>({11, 8}, 4);
    const auto w1 = make<w1_t>(m, {8, 12}, g1);
    const auto w2 = make<w2_t>(m, {12, 8}, g2);
    const auto b = make<b_t>(m, {12}, g3);
    const auto e = make<e_t>(m, {11, 8}, g4);
    const double want = std::sqrt(squares(g1) + squares(g2) + squares(g3) + squares(g4));

    const comm_stats axes_before = m.stats();
    const comm_stats world_before = m.world().stats();
    const double norm = global_norm(m, w1, w2, b, e);
    CHECK(norm == doctest::Approx(want).epsilon(1e-12));
    CHECK(same_counters(m.stats(), axes_before));
    CHECK((m.world().stats() - world_before)[collective::all_reduce].calls == 1);

    std::vector<norm_term> terms{norm_term_of(w1), norm_term_of(w2), norm_term_of(b),
                                 norm_term_of(e)};
    CHECK(global_norm(m, terms) == norm);
    // Terms built by hand: the replicated bias counted on one rank only.
    const bool bias_here = m.coord(0) == 0 && m.coord(1) == 0;
    CHECK(counts_on_this_rank(b) == bias_here);
    CHECK(counts_on_this_rank(w1));
    CHECK(counts_on_this_rank(w2) == (m.coord(0) == 0));
    terms[2] = norm_term{b.local(), bias_here};
    CHECK(global_norm(m, terms) == norm);
    // A term that does not count adds nothing; one counted everywhere adds one copy per rank.
    terms[2].counted = false;
    const double without_bias = global_norm(m, terms);
    CHECK(without_bias ==
          doctest::Approx(std::sqrt(squares(g1) + squares(g2) + squares(g4))).epsilon(1e-12));
    terms[2].counted = true;
    const double bias_everywhere = global_norm(m, terms);
    CHECK(
        bias_everywhere * bias_everywhere ==
        doctest::Approx(without_bias * without_bias + m.world_size() * squares(g3)).epsilon(1e-12));
    CHECK(same_counters(m.stats(), axes_before));
  }
}

TEST_CASE("global_norm: an inf or NaN anywhere reaches every rank") {
  mesh1 m(MPI_COMM_WORLD, {-1});
  using g_t = tensor<float, mesh1, "m", layout<split<'m', "dp">>>;
  std::vector<float> global(16, 1.0F);
  global[15] = std::numeric_limits<float>::infinity();  // on the last rank
  const auto g = make<g_t>(m, {16}, global);
  const double norm = global_norm(m, g);
  CHECK(std::isinf(norm));
  CHECK(clip_coefficient(norm, 1.0) == 0.0F);
  global[15] = std::numeric_limits<float>::quiet_NaN();
  const auto h = make<g_t>(m, {16}, global);
  CHECK(std::isnan(global_norm(m, h)));
}

TEST_CASE("clip_coefficient") {
  CHECK(clip_coefficient(0.5, 1.0) == 1.0F);
  // At the limit the 1e-6 guard leaves a factor just below 1.
  CHECK(clip_coefficient(1.0, 1.0) == static_cast<float>(1.0 / (1.0 + 1e-6)));
  CHECK(clip_coefficient(1.0, 1.0) < 1.0F);
  CHECK(clip_coefficient(4.0, 1.0) == doctest::Approx(0.25).epsilon(1e-6));
  CHECK(clip_coefficient(4.0, 0.0) == 1.0F);   // clipping off
  CHECK(clip_coefficient(4.0, -1.0) == 1.0F);  // clipping off
  CHECK(clip_coefficient(0.0, 1.0) == 1.0F);
  CHECK(std::isnan(clip_coefficient(std::numeric_limits<double>::quiet_NaN(), 1.0)));
  CHECK(clip_coefficient(std::numeric_limits<double>::infinity(), 1.0) == 0.0F);
}

TEST_CASE("loss scaler: one rank's inf makes every rank skip and back off together") {
  for (const auto& shape : mesh_shapes()) {
    mesh2 m(MPI_COMM_WORLD, shape);
    const int last = m.world_size() - 1;
    dynamic_loss_scaler scaler(1024.0F, 2.0F, 0.5F, 2, 1.0F);
    const comm_stats axes_before = m.stats();
    // Step 1: only the last rank's gradients overflow.
    std::vector<float16> grad(100, float16(1.0F));
    if (m.rank() == last) grad[42] = float16(1e6F);  // inf in float16
    const bool local = has_inf_or_nan(std::span<const float16>(grad));
    CHECK(local == (m.rank() == last));
    const bool found = any_rank(m, local);
    CHECK(found);
    CHECK_FALSE(scaler.update(found));
    // Steps 2, 3: clean everywhere; growth after two good steps.
    CHECK_FALSE(any_rank(m, false));
    CHECK(scaler.update(false));
    CHECK(scaler.update(any_rank(m, false)));
    CHECK(same_counters(m.stats(), axes_before));
    // Every rank holds the same state.
    const loss_scaler_state s = scaler.state();
    CHECK(s == loss_scaler_state{1024.0F, 0, 1});
    std::array<float, 2> mine{s.scale, static_cast<float>(s.skipped_steps)};
    std::vector<float> all(2 * static_cast<std::size_t>(m.world_size()));
    MPI_Allgather(mine.data(), 2, MPI_FLOAT, all.data(), 2, MPI_FLOAT, MPI_COMM_WORLD);
    for (std::size_t r = 0; r < all.size(); r += 2) {
      CHECK(all[r] == mine[0]);
      CHECK(all[r + 1] == mine[1]);
    }
  }
}
