// basic_tensor: which shard a rank holds, how it is filled, and what the type says.
// Runs at 1, 2 and 4 ranks on every mesh shape of fixtures.hpp's mesh_shapes().
#include <doctest/doctest.h>
#include <mpi.h>

#include <array>
#include <cstddef>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace {
using namespace zest;
using namespace zest::testing;
using mesh_t = mesh<"dp", "tp">;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// A value that tells a global index apart from every other (exact in float for these sizes).
double encode(const std::array<std::size_t, 2>& i) {
  return static_cast<double>(i[0] * 100 + i[1]);
}

// How many ranks hold each element: the product of the sizes of the axes that split nothing.
template <class X>
int replication(const mesh_t& m) {
  int r = 1;
  for (std::size_t a = 0; a < mesh_t::axis_count; ++a) r *= X::layout.is_split(a) ? 1 : m.size(a);
  return r;
}

// generate() calls f once per local element, with its global index, and the shards of all
// ranks cover the global tensor, each element exactly replication() times.
template <class X>
void check_generate(const mesh_t& m, const std::array<std::size_t, 2>& g,
                    const std::string& layout_text) {
  CAPTURE(m.describe());
  CAPTURE(g);
  CHECK(layout_string<X>() == layout_text);
  std::vector<std::array<std::size_t, 2>> seen;
  const X x = X::generate(m, g, [&](const std::array<std::size_t, 2>& i) {
    seen.push_back(i);
    return encode(i);
  });
  const auto& off = x.local_offsets();
  const auto& ext = x.local_extents();
  REQUIRE(x.local().size() == x.local_count());
  CHECK(x.local_count() == ext[0] * ext[1]);
  CHECK(x.extents() == g);
  CHECK(x.size() == g[0] * g[1]);
  CHECK(seen.size() == x.local_count());  // no call outside the shard
  for (const auto& i : seen) {
    CHECK(i[0] >= off[0]);
    CHECK(i[0] < off[0] + ext[0]);
    CHECK(i[1] >= off[1]);
    CHECK(i[1] < off[1] + ext[1]);
  }
  std::vector<int> count(g[0] * g[1], 0);
  for (std::size_t r = 0; r < ext[0]; ++r) {
    for (std::size_t c = 0; c < ext[1]; ++c) {
      const std::array<std::size_t, 2> global{off[0] + r, off[1] + c};
      CHECK(x.local()[r * ext[1] + c] == encode(global));
      ++count[global[0] * g[1] + global[1]];
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, count.data(), static_cast<int>(count.size()), MPI_INT, MPI_SUM,
                MPI_COMM_WORLD);
  const int want = replication<X>(m);
  for (int c : count) CHECK(c == want);
}

template <class X>
void check_round_trip(const mesh_t& m, const std::array<std::size_t, 2>& g,
                      const std::string& layout_text) {
  CAPTURE(m.describe());
  CAPTURE(g);
  CHECK(layout_string<X>() == layout_text);
  std::vector<typename X::value_type> global(g[0] * g[1]);
  std::iota(global.begin(), global.end(), typename X::value_type(1));
  const X x = X::from_global(m, g, std::span<const typename X::value_type>(global));
  for (std::size_t r = 0; r < x.local_extents()[0]; ++r) {
    for (std::size_t c = 0; c < x.local_extents()[1]; ++c) {
      const std::size_t flat = (x.local_offsets()[0] + r) * g[1] + x.local_offsets()[1] + c;
      const auto want = x.holds_partial_summand() ? global[flat] : typename X::value_type(0);
      CHECK(x.local()[r * x.local_extents()[1] + c] == want);
    }
  }
  CHECK(to_global(x) == global);
}

template <class X>
concept has_local_matrix = requires(X& x) {
  x.local_matrix();
};

}  // namespace

TEST_CASE("generate fills only the local shard, by global index") {
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    for (const std::array<std::size_t, 2>& g :
         {std::array<std::size_t, 2>{7, 5}, std::array<std::size_t, 2>{3, 2},
          std::array<std::size_t, 2>{0, 4}}) {
      check_generate<tensor<double, mesh_t, "ab">>(m, g, "replicate");
      check_generate<tensor<double, mesh_t, "ab", layout<split<'a', "dp">>>>(m, g, "split(a:dp)");
      check_generate<tensor<double, mesh_t, "ab", layout<split<'b', "tp">>>>(m, g, "split(b:tp)");
      check_generate<tensor<double, mesh_t, "ab", layout<split<'a', "dp">, split<'b', "tp">>>>(
          m, g, "split(a:dp) split(b:tp)");
      check_generate<tensor<double, mesh_t, "ab", layout<split<'a', "tp">, split<'b', "dp">>>>(
          m, g, "split(b:dp) split(a:tp)");
      check_generate<tensor<double, mesh_t, "ab", layout<split<'a', "dp", "tp">>>>(
          m, g, "split(a:dp,tp)");
      check_generate<tensor<float, mesh_t, "ab", layout<split<'b', "tp", "dp">>>>(m, g,
                                                                                  "split(b:tp,dp)");
    }
  }
}

TEST_CASE("from_global and to_global round trip") {
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    for (const std::array<std::size_t, 2>& g :
         {std::array<std::size_t, 2>{6, 4}, std::array<std::size_t, 2>{5, 3},
          std::array<std::size_t, 2>{1, 3}}) {
      check_round_trip<tensor<double, mesh_t, "ab">>(m, g, "replicate");
      check_round_trip<tensor<double, mesh_t, "ab", layout<split<'a', "dp">>>>(m, g, "split(a:dp)");
      check_round_trip<tensor<double, mesh_t, "ab", layout<split<'a', "dp">, split<'b', "tp">>>>(
          m, g, "split(a:dp) split(b:tp)");
      check_round_trip<tensor<double, mesh_t, "ab", layout<split<'b', "tp", "dp">>>>(
          m, g, "split(b:tp,dp)");
      check_round_trip<tensor<double, mesh_t, "ab", layout<partial<"dp">>>>(m, g, "partial(dp)");
      check_round_trip<tensor<float, mesh_t, "ab", layout<split<'a', "tp">, partial<"dp">>>>(
          m, g, "partial(dp) split(a:tp)");
      check_round_trip<tensor<std::int32_t, mesh_t, "ab", layout<split<'b', "dp">>>>(m, g,
                                                                                     "split(b:dp)");
    }
  }
}

TEST_CASE("uneven splits: local_offsets and local_extents") {
  const int n = world_size();
  const auto me = static_cast<std::size_t>(world_rank());
  // Hand-derived: 50257 over 1, 2, 4 ranks, split over dp then tp (rank = dp * tp_size + tp).
  // Nested balanced blocks over (dp, tp) give the same ranges as one balanced split over all ranks.
  const std::vector<block_range> vocab =
      n == 1 ? std::vector<block_range>{{0, 50257}}
      : n == 2
          ? std::vector<block_range>{{0, 25129}, {25129, 25128}}
          : std::vector<block_range>{{0, 12565}, {12565, 12564}, {25129, 12564}, {37693, 12564}};
  // 3 over 1, 2, 4 ranks: at 4 ranks the last one holds nothing.
  const std::vector<block_range> three =
      n == 1   ? std::vector<block_range>{{0, 3}}
      : n == 2 ? std::vector<block_range>{{0, 2}, {2, 1}}
               : std::vector<block_range>{{0, 1}, {1, 1}, {2, 1}, {3, 0}};
  REQUIRE(vocab.size() == static_cast<std::size_t>(n));
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    using v_t = tensor<float, mesh_t, "vm", layout<split<'v', "dp", "tp">>>;
    const auto v = v_t::generate(
        m, {50257, 2}, [](const auto& i) { return static_cast<float>(i[0] % 1000 + i[1]); });
    CHECK(v.local_offsets()[0] == vocab[me].offset);
    CHECK(v.local_extents()[0] == vocab[me].size);
    CHECK(v.local_offsets()[1] == 0);
    CHECK(v.local_extents()[1] == 2);
    CHECK(v.local_count() == 2 * vocab[me].size);
    const auto full = to_global(v);
    REQUIRE(full.size() == 2 * 50257U);
    bool all_right = true;
    for (std::size_t r = 0; r < 50257; ++r) {
      for (std::size_t c = 0; c < 2; ++c)
        all_right = all_right && full[r * 2 + c] == static_cast<float>(r % 1000 + c);
    }
    CHECK(all_right);

    using t_t = tensor<double, mesh_t, "vm", layout<split<'v', "dp", "tp">>>;
    const auto t = t_t::generate(m, {3, 2}, [](const auto& i) { return encode(i); });
    CHECK(t.local_offsets()[0] == three[me].offset);
    CHECK(t.local_extents()[0] == three[me].size);
    CHECK(t.local().size() == 2 * three[me].size);
    CHECK(t.local_matrix().rows() == static_cast<Eigen::Index>(three[me].size));
    CHECK(t.local_matrix().cols() == 2);
    // Gathering with an empty shard in the mix works.
    CHECK(to_global(t) == std::vector<double>{0, 1, 100, 101, 200, 201});

    if (shape == std::array<int, 2>{2, 2}) {
      // tp major: block index = tp * 2 + dp, so ranks 1 (dp 0, tp 1) and 2 (dp 1, tp 0) swap.
      using s_t = tensor<double, mesh_t, "vm", layout<split<'v', "tp", "dp">>>;
      const auto s = s_t::generate(m, {3, 2}, [](const auto& i) { return encode(i); });
      const std::vector<block_range> tp_major{{0, 1}, {2, 1}, {1, 1}, {3, 0}};
      CHECK(s.local_offsets()[0] == tp_major[me].offset);
      CHECK(s.local_extents()[0] == tp_major[me].size);
      CHECK(to_global(s) == std::vector<double>{0, 1, 100, 101, 200, 201});
    }
  }
}

TEST_CASE("local_matrix is an Eigen map over the shard's own memory") {
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    using x_t = tensor<float, mesh_t, "bsm", layout<split<'b', "dp">>>;
    auto x = x_t::generate(m, {4, 3, 5}, [](const auto& i) {
      return static_cast<float>(i[0] * 100 + i[1] * 10 + i[2]);
    });
    auto mat = x.local_matrix();
    CHECK(mat.rows() == static_cast<Eigen::Index>(x.local_extents()[0] * 3));
    CHECK(mat.cols() == 5);
    CHECK(mat.data() == x.local().data());
    // Row-major: element (b, s, m) is row b * 3 + s, column m.
    if (x.local_count() > 0) {
      // The last row: b = the shard's last, s = 2.
      const Eigen::Index last = mat.rows() - 1;
      const std::size_t b = x.local_offsets()[0] + x.local_extents()[0] - 1;
      CHECK(mat(last, 3) == static_cast<float>(b * 100 + 2 * 10 + 3));
      mat(last, 3) = 42.0F;  // writes through to the shard
      CHECK(x.local()[static_cast<std::size_t>(last) * 5 + 3] == 42.0F);
      x.local()[7] = -1.0F;  // and the shard's writes show in the map
      CHECK(mat(1, 2) == -1.0F);
      mat.setZero();
      for (float v : x.local()) CHECK(v == 0.0F);
    }
    const x_t& cx = x;
    static_assert(std::is_const_v<std::remove_pointer_t<decltype(cx.local_matrix().data())>>);
    CHECK(cx.local_matrix().data() == cx.local().data());

    // One dim: one row.
    using v_t = tensor<double, mesh_t, "v", layout<split<'v', "tp">>>;
    auto v = v_t::generate(m, {9}, [](const auto& i) { return static_cast<double>(i[0]); });
    CHECK(v.local_matrix().rows() == 1);
    CHECK(v.local_matrix().cols() == static_cast<Eigen::Index>(v.local_extents()[0]));
  }
  static_assert(has_local_matrix<tensor<double, local_mesh<"dp">, "ab">>);
  static_assert(
      !has_local_matrix<tensor<zest::bfloat16, local_mesh<"dp">, "ab">>);  // float and double only
}

// zest::bfloat16 spelled in full: with ZEST_HAS_BLAS=1, OpenBLAS's <cblas.h> (included by
// zest/backend/host/gemm.hpp) declares a global `typedef uint16_t bfloat16`, which makes a
// plain `bfloat16` ambiguous after `using namespace zest` (see
// tests/compile_fail/bfloat16_after_using_namespace.cpp).
TEST_CASE("bfloat16 storage") {
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    using x_t = tensor<zest::bfloat16, mesh_t, "ab", layout<split<'a', "dp">, split<'b', "tp">>>;
    static_assert(std::is_same_v<x_t::value_type, zest::bfloat16>);
    static_assert(sizeof(x_t::value_type) == 2);
    const auto x = x_t::generate(
        m, {5, 6}, [](const auto& i) { return static_cast<float>(i[0] * 6 + i[1]) + 0.1F; });
    CHECK(x.local().size_bytes() == 2 * x.local_count());
    for (std::size_t r = 0; r < x.local_extents()[0]; ++r) {
      for (std::size_t c = 0; c < x.local_extents()[1]; ++c) {
        const float want = zest::bfloat16(
            static_cast<float>((x.local_offsets()[0] + r) * 6 + x.local_offsets()[1] + c) + 0.1F);
        CHECK(static_cast<float>(x.local()[r * x.local_extents()[1] + c]) == want);
      }
    }
    // 0.1f = 0x3DCCCCCD rounds (to nearest even) to 0x3DCD; 1 + 0.1 = 1.1 -> 0x3F8D.
    const auto full = to_global(x);
    REQUIRE(full.size() == 30);
    CHECK(full[0].bits == 0x3DCD);
    CHECK(full[1].bits == 0x3F8D);

    std::vector<zest::bfloat16> global(30);
    for (std::size_t i = 0; i < 30; ++i)
      global[i] = zest::bfloat16(static_cast<float>(i) * 0.5F);  // exact in bf16
    const auto y = x_t::from_global(m, {5, 6}, std::span<const zest::bfloat16>(global));
    CHECK(to_global(y) == global);
  }
}

TEST_CASE("partial layout: generate puts the value on coordinate 0 only") {
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    auto f = [](const std::array<std::size_t, 2>& i) { return encode(i) + 1; };
    {
      using x_t = tensor<double, mesh_t, "ab", layout<partial<"tp">>>;
      REQUIRE(layout_string<x_t>() == "partial(tp)");  // see the last test case
      const auto x = x_t::generate(m, {3, 4}, f);
      CHECK(x.local_count() == 12);  // a partial axis does not cut the tensor
      CHECK(x.holds_partial_summand() == (m.coord(1) == 0));
      for (std::size_t k = 0; k < 12; ++k) {
        CHECK(x.local()[k] == (m.coord(1) == 0 ? f({k / 4, k % 4}) : 0.0));
      }
      CHECK(to_global(x) == to_global(tensor<double, mesh_t, "ab">::generate(m, {3, 4}, f)));
    }
    {
      using x_t = tensor<double, mesh_t, "ab", layout<split<'b', "tp">, partial<"dp">>>;
      REQUIRE(layout_string<x_t>() == "partial(dp) split(b:tp)");
      const auto x = x_t::generate(m, {3, 4}, f);
      CHECK(x.holds_partial_summand() == (m.coord(0) == 0));
      const auto& off = x.local_offsets();
      const auto& ext = x.local_extents();
      for (std::size_t r = 0; r < ext[0]; ++r) {
        for (std::size_t c = 0; c < ext[1]; ++c) {
          CHECK(x.local()[r * ext[1] + c] == (m.coord(0) == 0 ? f({off[0] + r, off[1] + c}) : 0.0));
        }
      }
      std::vector<double> want(12);
      for (std::size_t k = 0; k < 12; ++k) want[k] = f({k / 4, k % 4});
      CHECK(to_global(x) == want);
    }
    {
      // Partial over both axes: only rank (0, 0) holds the value.
      using x_t = tensor<double, mesh_t, "ab", layout<partial<"dp">, partial<"tp">>>;
      const auto x = x_t::generate(m, {2, 2}, f);
      CHECK(x.holds_partial_summand() == (m.rank() == 0));
      CHECK(to_global(x) == std::vector<double>{1, 2, 101, 102});
    }
  }
}

TEST_CASE("from_global with a wrong-sized array throws shape_error naming the dims") {
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    using x_t = tensor<double, mesh_t, "bsm", layout<split<'b', "dp">>>;
    const std::vector<double> global(11);
    std::string what;
    try {
      (void)x_t::from_global(m, {2, 3, 2}, std::span<const double>(global));
    } catch (const shape_error& e) {
      what = e.what();
    }
    CAPTURE(what);
    CHECK(what.find("\"bsm\"") != std::string::npos);
    CHECK(what.find("from_global") != std::string::npos);
    CHECK(what.find("11") != std::string::npos);
    CHECK(what.find("12") != std::string::npos);
    CHECK_THROWS_AS((void)x_t::from_global(m, {2, 3, 2}, std::span<const double>(global)),
                    shape_error);

    // A caller-computed shard of the wrong size is refused as well.
    CHECK_THROWS_AS(x_t(m, {4, 3, 2}, host_vector<double>(1000)), shape_error);
  }
}

TEST_CASE("has_layout, with_layout, layout_string") {
  using m_t = local_mesh<"dp", "tp">;
  using x_t = tensor<float, m_t, "bsm", layout<split<'b', "dp">>>;
  static_assert(has_layout<x_t, layout<split<'b', "dp">>>);
  static_assert(has_layout<x_t, layout<split<'b', "dp">, replicate<"tp">>>);  // the default
  static_assert(!has_layout<x_t, layout<>>);
  static_assert(!has_layout<x_t, layout<split<'s', "dp">>>);
  static_assert(!has_layout<x_t, layout<split<'b', "dp", "tp">>>);

  // Two spellings of one layout are one type.
  static_assert(std::is_same_v<tensor<float, m_t, "bsm", layout<split<'b', "dp">, partial<"tp">>>,
                               tensor<float, m_t, "bsm", layout<partial<"tp">, split<'b', "dp">>>>);
  static_assert(std::is_same_v<tensor<float, m_t, "bsm">,
                               tensor<float, m_t, "bsm", layout<replicate<"dp">>>>);

  using y_t = with_layout<x_t, layout_value_of<m_t, "bsm", layout<partial<"tp">>>>;
  static_assert(std::is_same_v<y_t, tensor<float, m_t, "bsm", layout<partial<"tp">>>>);
  static_assert(std::is_same_v<y_t::value_type, float> && std::is_same_v<y_t::mesh_type, m_t>);
  static_assert(y_t::dims == x_t::dims);
  static_assert(has_layout<y_t, layout<partial<"tp">>>);

  CHECK(layout_string<x_t>() == "split(b:dp)");
  CHECK(layout_string<y_t>() == "partial(tp)");
  CHECK(layout_string<tensor<float, m_t, "bsm">>() == "replicate");
  CHECK(layout_string<tensor<float, m_t, "bsm", layout<partial<"tp">, split<'b', "dp">>>>() ==
        "split(b:dp) partial(tp)");
  CHECK(layout_string<tensor<float, m_t, "mh", layout<split<'m', "dp", "tp">>>>() ==
        "split(m:dp,tp)");
  CHECK(layout_string<tensor<float, m_t, "mh", layout<split<'m', "tp", "dp">>>>() ==
        "split(m:tp,dp)");
  CHECK(layout_string<tensor<float, m_t, "mh", layout<split<'h', "tp">, split<'m', "dp">>>>() ==
        "split(m:dp) split(h:tp)");

  // The same on an MPI mesh type, whose sizes are only known at run time.
  CHECK(layout_string<tensor<double, mesh_t, "ab", layout<split<'a', "tp">, partial<"dp">>>>() ==
        "partial(dp) split(a:tp)");
}

// A regression test. g++ 12 compares class-type template arguments without their
// zero-valued array elements (with all-zero replicate placements, {split b, -} and
// {-, split b} were one template parameter object): tensor types whose layouts differed only
// in the axis collapsed into one type, with the layout of whichever was named first. The
// non-zero placement_kind enumerators (placement.hpp) avoid it. Fresh names here, so that no
// other test case names one of these layouts first.
TEST_CASE("layouts that differ only in the mesh axis give distinct tensor types") {
  using m_t = local_mesh<"rows", "cols">;
  using by_rows = tensor<float, m_t, "xy", layout<split<'x', "rows">>>;
  using by_cols = tensor<float, m_t, "xy", layout<split<'x', "cols">>>;
  CHECK(layout_string<by_rows>() == "split(x:rows)");
  CHECK(layout_string<by_cols>() == "split(x:cols)");
  CHECK_FALSE(std::is_same_v<by_rows, by_cols>);
  using sum_rows = tensor<double, m_t, "xy", layout<partial<"rows">>>;
  using sum_cols = tensor<double, m_t, "xy", layout<partial<"cols">>>;
  CHECK(layout_string<sum_rows>() == "partial(rows)");
  CHECK(layout_string<sum_cols>() == "partial(cols)");
  CHECK_FALSE(std::is_same_v<sum_rows, sum_cols>);
}
