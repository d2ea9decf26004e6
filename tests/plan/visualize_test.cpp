// visualize(): the ASCII map of which ranks hold which block of a 2-D tensor, compared with
// maps derived by hand for each world size (1, 2, 4 ranks). Every rank draws the same map,
// without communication, so every rank checks it.
//
// The format (zest/plan/visualize.hpp): a title; column heads indented by the row-head width
// + 3, each padded to the cell width + 2; rows "<row head> | " then the cells, each padded
// to the cell width + 2 (so lines end in spaces); a note per partial axis.
#include <doctest/doctest.h>
#include <mpi.h>

#include <array>
#include <string>

#include "support/fixtures.hpp"
#include "zest/plan/visualize.hpp"

namespace {
using namespace zest;
using namespace zest::testing;
using mesh_t = mesh<"dp", "tp">;

template <class X>
std::string draw(const mesh_t& m, const typename X::extents_type& extents) {
  return visualize(X(m, extents));
}

// One row of the map with cells of width w (padded to w + 2).
std::string cells(std::initializer_list<std::string> items, std::size_t w) {
  std::string out;
  for (const auto& c : items) out += c + std::string(w + 2 - c.size(), ' ');
  return out;
}

}  // namespace

TEST_CASE("visualize: rows split over dp") {
  using w_t = tensor<float, mesh_t, "mh", layout<split<'m', "dp">>>;
  const int n = world_size();
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    std::string want;
    if (n == 1) {
      want =
          "\"mh\" [8x6] split(m:dp) on mesh<dp=1, tp=1>\n"
          "         h 0..5  \n"
          "m 0..7 | 0       \n";
    } else if (shape == std::array<int, 2>{2, 1}) {
      want =
          "\"mh\" [8x6] split(m:dp) on mesh<dp=2, tp=1>\n"
          "         h 0..5  \n"
          "m 0..3 | 0       \n"
          "m 4..7 | 1       \n";
    } else if (shape == std::array<int, 2>{1, 2}) {
      want =
          "\"mh\" [8x6] split(m:dp) on mesh<dp=1, tp=2>\n"
          "         h 0..5  \n"
          "m 0..7 | 0,1     \n";
    } else if (shape == std::array<int, 2>{2, 2}) {
      want =
          "\"mh\" [8x6] split(m:dp) on mesh<dp=2, tp=2>\n"
          "         h 0..5  \n"
          "m 0..3 | 0,1     \n"
          "m 4..7 | 2,3     \n";
    } else if (shape == std::array<int, 2>{4, 1}) {
      want =
          "\"mh\" [8x6] split(m:dp) on mesh<dp=4, tp=1>\n"
          "         h 0..5  \n"
          "m 0..1 | 0       \n"
          "m 2..3 | 1       \n"
          "m 4..5 | 2       \n"
          "m 6..7 | 3       \n";
    } else {  // 1 x 4
      want =
          "\"mh\" [8x6] split(m:dp) on mesh<dp=1, tp=4>\n"
          "         h 0..5   \n"
          "m 0..7 | 0,1,2,3  \n";
    }
    CHECK(draw<w_t>(m, {8, 6}) == want);
  }
}

TEST_CASE("visualize: both dims split, one per axis") {
  using w_t = tensor<float, mesh_t, "mh", layout<split<'m', "dp">, split<'h', "tp">>>;
  const int n = world_size();
  const mesh_t m(MPI_COMM_WORLD, n == 4 ? std::array<int, 2>{2, 2} : std::array<int, 2>{n, 1});
  std::string want;
  if (n == 1) {
    want =
        "\"mh\" [8x6] split(m:dp) split(h:tp) on mesh<dp=1, tp=1>\n"
        "         h 0..5  \n"
        "m 0..7 | 0       \n";
  } else if (n == 2) {
    want =
        "\"mh\" [8x6] split(m:dp) split(h:tp) on mesh<dp=2, tp=1>\n"
        "         h 0..5  \n"
        "m 0..3 | 0       \n"
        "m 4..7 | 1       \n";
  } else {
    want =
        "\"mh\" [8x6] split(m:dp) split(h:tp) on mesh<dp=2, tp=2>\n"
        "         h 0..2  h 3..5  \n"
        "m 0..3 | " +
        cells({"0", "1"}, 6) +
        "\n"
        "m 4..7 | " +
        cells({"2", "3"}, 6) + "\n";
  }
  CHECK(draw<w_t>(m, {8, 6}) == want);
}

TEST_CASE("visualize: partial axes are noted below the map") {
  const int n = world_size();
  const mesh_t m(MPI_COMM_WORLD, n == 4 ? std::array<int, 2>{2, 2} : std::array<int, 2>{n, 1});
  {
    using y_t = tensor<float, mesh_t, "mh", layout<split<'m', "dp">, partial<"tp">>>;
    std::string want;
    if (n == 1) {
      want =
          "\"mh\" [4x6] split(m:dp) partial(tp) on mesh<dp=1, tp=1>\n"
          "         h 0..5  \n"
          "m 0..3 | 0       \n";
    } else if (n == 2) {
      want =
          "\"mh\" [4x6] split(m:dp) partial(tp) on mesh<dp=2, tp=1>\n"
          "         h 0..5  \n"
          "m 0..1 | 0       \n"
          "m 2..3 | 1       \n";
    } else {
      want =
          "\"mh\" [4x6] split(m:dp) partial(tp) on mesh<dp=2, tp=2>\n"
          "         h 0..5  \n"
          "m 0..1 | 0,1     \n"
          "m 2..3 | 2,3     \n";
    }
    want += "(partial over tp: the ranks listed hold summands of each block)\n";
    CHECK(draw<y_t>(m, {4, 6}) == want);
  }
  {
    using y_t = tensor<double, mesh_t, "mh", layout<partial<"dp">, split<'h', "tp">>>;
    std::string want;
    if (n == 1) {
      want =
          "\"mh\" [2x4] partial(dp) split(h:tp) on mesh<dp=1, tp=1>\n"
          "         h 0..3  \n"
          "m 0..1 | 0       \n";
    } else if (n == 2) {
      want =
          "\"mh\" [2x4] partial(dp) split(h:tp) on mesh<dp=2, tp=1>\n"
          "         h 0..3  \n"
          "m 0..1 | 0,1     \n";
    } else {
      want =
          "\"mh\" [2x4] partial(dp) split(h:tp) on mesh<dp=2, tp=2>\n"
          "         h 0..1  h 2..3  \n"
          "m 0..1 | 0,2     1,3     \n";
    }
    want += "(partial over dp: the ranks listed hold summands of each block)\n";
    CHECK(draw<y_t>(m, {2, 4}) == want);
  }
}

TEST_CASE("visualize: uneven and nested splits, replicated tensors") {
  const int n = world_size();
  const mesh_t m(MPI_COMM_WORLD, n == 4 ? std::array<int, 2>{2, 2} : std::array<int, 2>{n, 1});
  {
    // 3 rows over (dp, tp): at 4 ranks rank 3 holds no row and appears in no cell.
    using v_t = tensor<float, mesh_t, "mh", layout<split<'m', "dp", "tp">>>;
    std::string want;
    if (n == 1) {
      want =
          "\"mh\" [3x2] split(m:dp,tp) on mesh<dp=1, tp=1>\n"
          "         h 0..1  \n"
          "m 0..2 | 0       \n";
    } else if (n == 2) {
      want =
          "\"mh\" [3x2] split(m:dp,tp) on mesh<dp=2, tp=1>\n"
          "         h 0..1  \n"
          "m 0..1 | 0       \n"
          "m 2..2 | 1       \n";
    } else {
      want =
          "\"mh\" [3x2] split(m:dp,tp) on mesh<dp=2, tp=2>\n"
          "         h 0..1  \n"
          "m 0..0 | 0       \n"
          "m 1..1 | 1       \n"
          "m 2..2 | 2       \n"
          "(nothing on ranks 3)\n";
    }
    CHECK(draw<v_t>(m, {3, 2}) == want);
  }
  {
    // Columns split over dp then tp: 10 = 5 + 5, each 3 + 2.
    using v_t = tensor<float, mesh_t, "ab", layout<split<'b', "dp", "tp">>>;
    std::string want;
    if (n == 1) {
      want =
          "\"ab\" [2x10] split(b:dp,tp) on mesh<dp=1, tp=1>\n"
          "         b 0..9  \n"
          "a 0..1 | 0       \n";
    } else if (n == 2) {
      want =
          "\"ab\" [2x10] split(b:dp,tp) on mesh<dp=2, tp=1>\n"
          "         b 0..4  b 5..9  \n"
          "a 0..1 | 0       1       \n";
    } else {
      want =
          "\"ab\" [2x10] split(b:dp,tp) on mesh<dp=2, tp=2>\n"
          "         b 0..2  b 3..4  b 5..7  b 8..9  \n"
          "a 0..1 | 0       1       2       3       \n";
    }
    CHECK(draw<v_t>(m, {2, 10}) == want);
  }
  {
    // Replicated: one block that every rank holds; wider heads widen the columns.
    using r_t = tensor<double, mesh_t, "mh">;
    const std::string who = n == 1 ? "0" : n == 2 ? "0,1" : "0,1,2,3";
    const std::size_t w = n == 4 ? 7 : 6;
    const std::string want = "\"mh\" [12x6] replicate on " + m.describe() + "\n" +
                             std::string(10, ' ') + cells({"h 0..5"}, w) + "\n" + "m 0..11 | " +
                             cells({who}, w) + "\n";
    CHECK(draw<r_t>(m, {12, 6}) == want);
  }
}
