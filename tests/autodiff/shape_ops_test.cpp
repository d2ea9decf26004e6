// The shape ops of zest/autodiff/shape_ops.hpp (narrow, concat, index_select, merge_dims,
// split_dim) at 1, 2 and 4 ranks: values against references computed here on global
// row-major arrays, gradients with zest::testing::check_gradients (double, default
// tolerances), and the result layout (the input's, or its dims renamed). Along b, t and m of
// "btm" (first, middle and last dim), replicated, split over dp, over dp x tp, t split over
// dp and tp together, and m split with tp partial; b = 5, t = 7 and m = 6 do not split
// evenly over 2 or 4 ranks, so shards are uneven, along the op's dim too. Each on the host
// backend (mesh<"dp", "tp">) at every 2-D mesh shape of the world (the conformance suite,
// tests/backend/conformance, compares the device backends' code paths). Bad ranges,
// mismatched operands and bad ids throw zest::shape_error naming the op, the dim and the
// extents.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/autodiff/shape_ops.hpp"
#include "zest/testing/check_gradients.hpp"

namespace {
using namespace zest;
using namespace zest::testing;
namespace ad = zest::autodiff;
using zest::testing::check_gradients;
using zest::testing::gradient_check_options;
using zest::testing::weighted_sum;

using extents3 = std::array<std::size_t, 3>;
const extents3 xe{5, 7, 6};

// f(mesh) on mesh<"dp", "tp"> at each mesh shape. The device backends' code paths are
// compared with the host's, op by op, by the conformance suite (tests/backend/conformance).
template <class F>
void on_every_mesh(F f) {
  for (const auto& shape : mesh_shapes()) {
    mesh<"dp", "tp"> m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    f(m);
  }
}

// The layouts of "btm" each op is checked in.
template <class F>
void on_every_layout(F f) {
  f.template operator()<layout<>>();
  f.template operator()<layout<split<'b', "dp">>>();
  f.template operator()<layout<split<'b', "dp">, split<'t', "tp">>>();
  f.template operator()<layout<split<'t', "dp", "tp">>>();
  f.template operator()<layout<split<'m', "dp">, partial<"tp">>>();
}

constexpr std::size_t dim_of(char d) { return d == 'b' ? 0 : d == 't' ? 1 : 2; }

// The global multi-index of a row-major flat position, and back.
extents3 index_of(std::size_t flat, const extents3& e) {
  extents3 i{};
  for (std::size_t k = 3; k-- > 0;) {
    i[k] = flat % e[k];
    flat /= e[k];
  }
  return i;
}
std::size_t flat_of(const extents3& i, const extents3& e) {
  return (i[0] * e[1] + i[1]) * e[2] + i[2];
}
std::size_t count_of(const extents3& e) { return e[0] * e[1] * e[2]; }

// References: y[i] = x[map(i)] along dim d.
template <class Map>
std::vector<double> gather_ref(const std::vector<double>& x, const extents3& xe_,
                               const extents3& ye, std::size_t d, Map map) {
  std::vector<double> y(count_of(ye));
  for (std::size_t f = 0; f < y.size(); ++f) {
    extents3 i = index_of(f, ye);
    i[d] = map(i[d]);
    y[f] = x[flat_of(i, xe_)];
  }
  return y;
}

gradient_check_options options() {
  gradient_check_options o;
  o.max_elements = 24;
  return o;
}

template <class T>
std::vector<double> global_of(const T& t) {
  const auto g = to_global(t);
  return std::vector<double>(g.begin(), g.end());
}

template <char D>
void check_narrow() {
  constexpr std::size_t d = dim_of(D);
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    on_every_layout([&]<class L>() {
      using x_t = tensor<double, M, "btm", L>;
      CAPTURE(layout_string<x_t>());
      const auto in = global_values(xe, 3);
      const x_t x = x_t::from_global(m, xe, in);
      // A middle range, the whole dim, one element at the end, and an empty one.
      const std::size_t n = xe[d];
      const std::array<std::array<std::size_t, 2>, 4> ranges{
          {{1, n - 2}, {0, n}, {n - 1, 1}, {2, 0}}};
      for (const auto& range : ranges) {
        const std::size_t start = range[0], length = range[1];
        CAPTURE(start);
        CAPTURE(length);
        auto y = zest::narrow<D>(x, start, length);
        static_assert(std::is_same_v<decltype(y), x_t>);
        extents3 ye = xe;
        ye[d] = length;
        CHECK(y.extents() == ye);
        CHECK(relative_error(global_of(y), gather_ref(in, xe, ye, d, [&](std::size_t j) {
                               return start + j;
                             })) < 1e-15);
        if (length == 0) continue;
        const auto r = check_gradients(
            options(),
            [&](ad::tape& t, const auto& v) {
              auto z = ad::narrow<D>(v, start, length);
              static_assert(std::is_same_v<typename decltype(z)::tensor_type, x_t>);
              return weighted_sum(t, z);
            },
            x);
        CHECK_MESSAGE(r.ok(), r);
      }
      // Out of range: the op, the dim and the extent in the message.
      try {
        (void)zest::narrow<D>(x, n - 1, 2);
        FAIL("no shape_error");
      } catch (const shape_error& e) {
        const std::string what = e.what();
        CHECK(what.find(std::string("narrow<'") + D + "'>") != std::string::npos);
        CHECK(what.find("extent " + std::to_string(n)) != std::string::npos);
      }
    });
  });
}

TEST_CASE("narrow along b") { check_narrow<'b'>(); }
TEST_CASE("narrow along t") { check_narrow<'t'>(); }
TEST_CASE("narrow along m") { check_narrow<'m'>(); }

template <char D>
void check_concat() {
  constexpr std::size_t d = dim_of(D);
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    on_every_layout([&]<class L>() {
      using x_t = tensor<double, M, "btm", L>;
      CAPTURE(layout_string<x_t>());
      extents3 ea = xe, eb = xe, ec = xe;
      ea[d] = 3;
      eb[d] = 1;
      ec[d] = 4;
      const auto ga = global_values(ea, 1), gb = global_values(eb, 2), gc = global_values(ec, 5);
      const x_t a = x_t::from_global(m, ea, ga), b = x_t::from_global(m, eb, gb),
                c = x_t::from_global(m, ec, gc);
      // Reference: each output position from its operand.
      extents3 ye = xe;
      ye[d] = 8;
      std::vector<double> want(count_of(ye));
      for (std::size_t f = 0; f < want.size(); ++f) {
        extents3 i = index_of(f, ye);
        if (i[d] < 3) {
          want[f] = ga[flat_of(i, ea)];
        } else if (i[d] < 4) {
          i[d] -= 3;
          want[f] = gb[flat_of(i, eb)];
        } else {
          i[d] -= 4;
          want[f] = gc[flat_of(i, ec)];
        }
      }
      auto y = zest::concat<D>(a, b, c);
      static_assert(std::is_same_v<decltype(y), x_t>);
      CHECK(y.extents() == ye);
      CHECK(relative_error(global_of(y), want) < 1e-15);
      auto two = zest::concat<D>(a, b);
      CHECK(two.extents()[d] == 4);
      const auto r3 = check_gradients(
          options(),
          [](ad::tape& t, const auto& va, const auto& vb, const auto& vc) {
            auto z = ad::concat<D>(va, vb, vc);
            static_assert(std::is_same_v<typename decltype(z)::tensor_type, x_t>);
            return weighted_sum(t, z);
          },
          a, b, c);
      CHECK_MESSAGE(r3.ok(), r3);
      // An operand twice: both gradients add up.
      const auto r2 = check_gradients(
          options(),
          [](ad::tape& t, const auto& va, const auto& vc) {
            return weighted_sum(t, ad::concat<D>(va, vc, va));
          },
          a, c);
      CHECK_MESSAGE(r2.ok(), r2);
      // Other extents differ: named.
      extents3 bad = xe;
      bad[d] = 2;
      bad[(d + 1) % 3] += 1;
      const x_t wrong = x_t::from_global(m, bad, global_values(bad, 9));
      try {
        (void)zest::concat<D>(a, wrong);
        FAIL("no shape_error");
      } catch (const shape_error& e) {
        const std::string what = e.what();
        CHECK(what.find(std::string("concat<'") + D + "'>") != std::string::npos);
        CHECK(what.find("operand 1") != std::string::npos);
      }
    });
  });
}

TEST_CASE("concat along b") { check_concat<'b'>(); }
TEST_CASE("concat along t") { check_concat<'t'>(); }
TEST_CASE("concat along m") { check_concat<'m'>(); }

template <char D>
void check_index_select() {
  constexpr std::size_t d = dim_of(D);
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    using ids_t = tensor<std::int32_t, M, "r">;
    on_every_layout([&]<class L>() {
      using x_t = tensor<double, M, "btm", L>;
      CAPTURE(layout_string<x_t>());
      const auto in = global_values(xe, 4);
      const x_t x = x_t::from_global(m, xe, in);
      const auto n = static_cast<std::int32_t>(xe[d]);
      // Repeats (the scatter adds), the last row, an unused row (n - 2 for n >= 5).
      const std::vector<std::int32_t> picks{n - 1, 0, 2, 0, n - 1, 1, 0};
      const ids_t ids = ids_t::from_global(m, {picks.size()}, picks);
      auto y = zest::index_select<D>(x, ids);
      static_assert(std::is_same_v<decltype(y), x_t>);
      extents3 ye = xe;
      ye[d] = picks.size();
      CHECK(y.extents() == ye);
      const auto want = gather_ref(
          in, xe, ye, d, [&](std::size_t j) { return static_cast<std::size_t>(picks[j]); });
      CHECK(relative_error(global_of(y), want) < 1e-15);
      {  // On a constant (no gradient recorded).
        ad::tape t;
        auto c = ad::index_select<D>(t.constant(x), ids);
        CHECK_FALSE(c.requires_grad());
        CHECK(relative_error(global_of(c.value()), want) < 1e-15);
      }
      const auto r = check_gradients(
          options(),
          [&](ad::tape& t, const auto& v) {
            auto z = ad::index_select<D>(v, ids);
            static_assert(std::is_same_v<typename decltype(z)::tensor_type, x_t>);
            return weighted_sum(t, z);
          },
          x);
      CHECK_MESSAGE(r.ok(), r);
      // A bad id: named with its position and the extent.
      const std::vector<std::int32_t> bad{0, 1, n + 2};
      const ids_t bad_ids = ids_t::from_global(m, {bad.size()}, bad);
      try {
        (void)zest::index_select<D>(x, bad_ids);
        FAIL("no shape_error");
      } catch (const shape_error& e) {
        const std::string what = e.what();
        CHECK(what.find(std::string("index_select<'") + D + "'>") != std::string::npos);
        CHECK(what.find("id " + std::to_string(n + 2) + " at position 2") != std::string::npos);
        CHECK(what.find("[0, " + std::to_string(n) + ")") != std::string::npos);
      }
    });
  });
}

TEST_CASE("index_select along b") { check_index_select<'b'>(); }
TEST_CASE("index_select along t") { check_index_select<'t'>(); }
TEST_CASE("index_select along m") { check_index_select<'m'>(); }

// A composition: the tape op of a narrowed, concatenated pair through a nonlinear op, with
// its gradient reaching both inputs (split along the dim the ops work on).
TEST_CASE("narrow of a concat, through tanh") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    using x_t = tensor<double, M, "btm", layout<split<'t', "dp">, split<'m', "tp">>>;
    extents3 eb = xe;
    eb[1] = 3;
    const x_t a = x_t::from_global(m, xe, global_values(xe, 6));
    const x_t b = x_t::from_global(m, eb, global_values(eb, 7));
    const auto r = check_gradients(
        options(),
        [](ad::tape& t, const auto& va, const auto& vb) {
          return weighted_sum(t, ad::tanh(ad::narrow<'t'>(ad::concat<'t'>(va, vb), 4, 5)));
        },
        a, b);
    CHECK_MESSAGE(r.ok(), r);
  });
}

// merge_dims / split_dim: the global values are unchanged (row-major), the layout follows the
// dims, and a round trip gives x's values back.
TEST_CASE("merge_dims and split_dim") {
  on_every_mesh([&](const auto& m) {
    using M = std::remove_cvref_t<decltype(m)>;
    static_assert(
        std::is_same_v<decltype(zest::merge_dims<"bk">(
                           std::declval<tensor<double, M, "btm",
                                               layout<split<'b', "dp">, split<'t', "tp">>>>())),
                       tensor<double, M, "bk", layout<split<'b', "dp">, split<'k', "tp">>>>);
    static_assert(std::is_same_v<
                  decltype(zest::split_dim<"bsh">(
                      std::declval<tensor<double, M, "bk", layout<split<'k', "dp", "tp">>>>(), 1)),
                  tensor<double, M, "bsh", layout<split<'s', "dp", "tp">>>>);
    on_every_layout([&]<class L>() {
      using x_t = tensor<double, M, "btm", L>;
      CAPTURE(layout_string<x_t>());
      const auto in = global_values(xe, 8);
      const x_t x = x_t::from_global(m, xe, in);
      // t and m as k, and b and t as k.
      auto inner = zest::merge_dims<"bk">(x);
      CHECK(inner.extents() == std::array<std::size_t, 2>{5, 42});
      CHECK(relative_error(global_of(inner), in) < 1e-15);
      auto outer = zest::merge_dims<"km">(x);
      CHECK(outer.extents() == std::array<std::size_t, 2>{35, 6});
      CHECK(relative_error(global_of(outer), in) < 1e-15);
      // Back (the axes that split the merged dim now split its outer part: x's layout again
      // unless x split the inner one).
      auto back = zest::split_dim<"btm">(inner, 7);
      CHECK(relative_error(global_of(back), in) < 1e-15);
      auto back2 = zest::split_dim<"btm">(outer, 5);
      CHECK(relative_error(global_of(back2), in) < 1e-15);
      const auto r = check_gradients(
          options(),
          [](ad::tape& t, const auto& v) {
            // Merged, narrowed along the merged dim (a range across rows of m), split again.
            auto k = ad::merge_dims<"bk">(v);
            return weighted_sum(t, ad::split_dim<"bsh">(ad::narrow<'k'>(k, 3, 36), 9));
          },
          x);
      CHECK_MESSAGE(r.ok(), r);
      const auto r2 = check_gradients(
          options(),
          [](ad::tape& t, const auto& v) { return weighted_sum(t, ad::merge_dims<"km">(v)); }, x);
      CHECK_MESSAGE(r2.ok(), r2);
      // split_dim's outer extent must divide the dim.
      try {
        (void)zest::split_dim<"bsh">(inner, 5);
        FAIL("no shape_error");
      } catch (const shape_error& e) {
        const std::string what = e.what();
        CHECK(what.find("split_dim<\"bsh\">") != std::string::npos);
        CHECK(what.find("extent 42, not a multiple of 5") != std::string::npos);
      }
    });
  });
}

}  // namespace
