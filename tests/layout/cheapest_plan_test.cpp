// The costed planner (cheapest_plan) against an independent
// exhaustive search: for every pair of valid layouts of 2- and 3-dim tensors on meshes of
// 1, 2 and 3 axes (and a sample on 4 axes), even and uneven extents, the planner's plan is
// a valid sequence of single-axis steps that ends at the target, and no sequence of steps
// whatever is cheaper. Planning needs no communicator, so this is a plain test.
//
// What is independent of the planner here: the list of layouts, which steps are valid from
// a layout and what they lead to, the maximum over ranks (every rank of the mesh is priced),
// and the search (a relaxation over all step sequences, of every length, cross-checked by a
// plain depth-first enumeration of all sequences on the small cases). What is shared, on
// purpose: the price of one step at one rank, detail::step_elements, which is the function
// that explain and the communicators' counters agree with.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "zest/layout/cheapest_plan.hpp"
#include "zest/layout/fixed_order_plan.hpp"
#include "zest/layout/layout.hpp"
#include "zest/layout/step.hpp"
#include "zest/layout/step_cost.hpp"
#include "zest/mesh/mesh.hpp"

namespace {
using namespace zest;

// --- the hand case of issue 10: x "bm" [4x12] floats on a 2x2 mesh<"dp","tp"> -----------

using mesh_t = local_mesh<"dp", "tp">;
constexpr layout_value from_bm =
    layout_value_of<mesh_t, "bm", layout<split<'b', "dp">, split<'m', "tp">>>;
constexpr layout_value to_bm = layout_value_of<mesh_t, "bm", layout<split<'m', "dp">>>;
constexpr transition_shape shape_bm = make_transition_shape(
    std::string_view("bm"), std::array<std::size_t, 2>{4, 12}, std::array<int, 2>{2, 2});
constexpr transition_plan fixed_bm = fixed_order_plan(from_bm, to_bm);
constexpr transition_plan cheap_bm = cheapest_plan(from_bm, to_bm, shape_bm);  // at compile time
// Fixed order: all_gather over tp 48 B, all_gather over dp 96 B, slice: 144 B per rank.
static_assert(fixed_bm.size() == 3 && fixed_bm.collectives() == 2);
static_assert(cost_of(fixed_bm, from_bm, shape_bm).elements * sizeof(float) == 144);
// Cheapest: all_gather over tp 48 B, then one all_to_all over dp (b -> m) 48 B: 96 B.
static_assert(cheap_bm.size() == 2);
static_assert(cheap_bm[0] == transition_step{step_kind::all_gather, 1, 'm', 0});
static_assert(cheap_bm[1] == transition_step{step_kind::all_to_all, 0, 'b', 'm'});
static_assert(cost_of(cheap_bm, from_bm, shape_bm).elements * sizeof(float) == 96);
// A plan that sends nothing stays the fixed one, and so does one that is already cheapest.
static_assert(cheapest_plan(to_bm, to_bm, shape_bm).size() == 0);
static_assert(cheapest_plan(layout_value_of<mesh_t, "bm", layout<split<'m', "dp">>>,
                            layout_value_of<mesh_t, "bm", layout<>>, shape_bm)
                  .collectives() == 1);

// --- an independent model of layouts and steps ----------------------------------------

struct setting {
  std::string dims;
  std::vector<std::size_t> extents;
  std::vector<int> sizes;
  std::string name() const {
    std::ostringstream s;
    s << '"' << dims << "\" [";
    for (std::size_t i = 0; i < extents.size(); ++i) s << (i ? "x" : "") << extents[i];
    s << "] on ";
    for (std::size_t a = 0; a < sizes.size(); ++a) s << (a ? "x" : "") << sizes[a];
    return s.str();
  }
  transition_shape shape() const { return make_transition_shape(dims, extents, sizes); }
};

std::size_t splits_of(layout_value v, char d) {
  std::size_t k = 0;
  for (std::size_t a = 0; a < v.axis_count; ++a)
    k += (v.axes[a].kind == placement_kind::split && v.axes[a].dim == d) ? 1 : 0;
  return k;
}

// A layout is well formed when each split dim's axes have the orders 0..k-1 once each.
bool well_formed(layout_value v, std::string_view dims) {
  for (std::size_t a = 0; a < v.axis_count; ++a) {
    const auto& p = v.axes[a];
    if (p.kind == placement_kind::split) {
      if (dims.find(p.dim) == std::string_view::npos) return false;
    } else if (p.dim != 0 || p.order != 0) {
      return false;
    }
  }
  for (char d : dims) {
    const std::size_t k = splits_of(v, d);
    std::vector<int> seen(k, 0);
    for (std::size_t a = 0; a < v.axis_count; ++a) {
      const auto& p = v.axes[a];
      if (p.kind != placement_kind::split || p.dim != d) continue;
      if (p.order >= k || seen[p.order]++) return false;
    }
  }
  return true;
}

// Every layout: each axis replicates, holds a partial sum or splits one dim; each dim's
// axes in every nesting order.
std::vector<layout_value> all_layouts(std::string_view dims, std::size_t axes) {
  std::vector<layout_value> out;
  const std::size_t options = dims.size() + 2;
  std::size_t combos = 1;
  for (std::size_t a = 0; a < axes; ++a) combos *= options;
  for (std::size_t c = 0; c < combos; ++c) {
    std::vector<std::size_t> pick(axes);
    std::size_t rest = c;
    for (std::size_t a = 0; a < axes; ++a) {
      pick[a] = rest % options;
      rest /= options;
    }
    // For each dim, the axes that split it; then every permutation of each list.
    std::vector<std::vector<std::size_t>> by_dim(dims.size());
    for (std::size_t a = 0; a < axes; ++a)
      if (pick[a] >= 2) by_dim[pick[a] - 2].push_back(a);
    auto emit = [&](auto&& self, std::size_t d) -> void {
      if (d == dims.size()) {
        layout_value v = replicated_layout(axes);
        for (std::size_t a = 0; a < axes; ++a)
          if (pick[a] == 1) v.axes[a] = axis_placement{placement_kind::partial, 0, 0};
        for (std::size_t i = 0; i < dims.size(); ++i)
          for (std::size_t k = 0; k < by_dim[i].size(); ++k)
            v.axes[by_dim[i][k]] =
                axis_placement{placement_kind::split, dims[i], static_cast<std::uint8_t>(k)};
        out.push_back(v);
        return;
      }
      auto list = by_dim[d];
      std::sort(list.begin(), list.end());
      do {
        by_dim[d] = list;
        self(self, d + 1);
      } while (std::next_permutation(list.begin(), list.end()));
    };
    emit(emit, 0);
  }
  return out;
}

// Whether step s may be taken from v (the steps of the transition table in
// docs/design-notes.md, with nesting), and the layout it leads to. Written from the rules,
// not from the planner's code.
bool try_step(layout_value v, const transition_step& s, std::string_view dims, layout_value& next) {
  if (s.axis >= v.axis_count) return false;
  const auto& p = v.axes[s.axis];
  const bool known_dim = s.dim != 0 && dims.find(s.dim) != std::string_view::npos;
  const bool known_to = s.to_dim != 0 && dims.find(s.to_dim) != std::string_view::npos;
  const bool innermost =
      p.kind == placement_kind::split && p.dim == s.dim && p.order + 1U == splits_of(v, s.dim);
  next = v;
  auto& q = next.axes[s.axis];
  switch (s.kind) {
    case step_kind::all_gather:
      if (!innermost || s.to_dim != 0) return false;
      q = axis_placement{placement_kind::replicate, 0, 0};
      return true;
    case step_kind::all_to_all:
      if (!innermost || !known_to || s.to_dim == s.dim) return false;
      q = axis_placement{placement_kind::split, s.to_dim,
                         static_cast<std::uint8_t>(splits_of(v, s.to_dim))};
      return true;
    case step_kind::all_reduce:
      if (p.kind != placement_kind::partial || s.dim != 0 || s.to_dim != 0) return false;
      q = axis_placement{placement_kind::replicate, 0, 0};
      return true;
    case step_kind::reduce_scatter:
      if (p.kind != placement_kind::partial || !known_dim || s.to_dim != 0) return false;
      q = axis_placement{placement_kind::split, s.dim,
                         static_cast<std::uint8_t>(splits_of(v, s.dim))};
      return true;
    case step_kind::slice:
      if (p.kind != placement_kind::replicate || !known_dim || s.to_dim != 0) return false;
      q = axis_placement{placement_kind::split, s.dim,
                         static_cast<std::uint8_t>(splits_of(v, s.dim))};
      return true;
    case step_kind::zero_partial:
      if (p.kind != placement_kind::replicate || s.dim != 0 || s.to_dim != 0) return false;
      q = axis_placement{placement_kind::partial, 0, 0};
      return true;
  }
  return false;
}

// Every step valid from v, found by trying every (kind, axis, dim, to_dim).
std::vector<std::pair<transition_step, layout_value>> steps_from(layout_value v,
                                                                 std::string_view dims) {
  std::vector<std::pair<transition_step, layout_value>> out;
  const step_kind kinds[] = {step_kind::all_gather, step_kind::reduce_scatter,
                             step_kind::all_reduce, step_kind::all_to_all,
                             step_kind::slice,      step_kind::zero_partial};
  std::string letters(1, '\0');
  letters += dims;
  for (step_kind k : kinds)
    for (std::size_t a = 0; a < v.axis_count; ++a)
      for (char d : letters)
        for (char e : letters) {
          const transition_step s{k, static_cast<std::uint8_t>(a), d, e};
          layout_value next{};
          if (try_step(v, s, dims, next)) out.emplace_back(s, next);
        }
  return out;
}

// The most that any rank sends in step s from v: every rank of the mesh priced.
std::uint64_t worst_rank(const transition_step& s, layout_value v, const setting& st,
                         const transition_shape& sh) {
  if (!is_collective(s.kind)) return 0;
  std::size_t ranks = 1;
  for (int n : st.sizes) ranks *= static_cast<std::size_t>(n);
  std::uint64_t worst = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    detail::mesh_coords c{};
    std::size_t rest = r;
    for (std::size_t a = 0; a < st.sizes.size(); ++a) {
      c[a] = static_cast<int>(rest % static_cast<std::size_t>(st.sizes[a]));
      rest /= static_cast<std::size_t>(st.sizes[a]);
    }
    worst = std::max<std::uint64_t>(worst, detail::step_elements(s, v, sh, c));
  }
  return worst;
}

struct price {
  std::uint64_t elements = 0;
  std::uint32_t collectives = 0;
  bool operator==(const price&) const = default;
  bool operator<(const price& o) const {
    return elements != o.elements ? elements < o.elements : collectives < o.collectives;
  }
  price operator+(const price& o) const {
    return {elements + o.elements, collectives + o.collectives};
  }
};
constexpr price unreachable{~std::uint64_t{0} / 4, 1U << 30U};

struct graph {
  std::vector<layout_value> layouts;
  std::map<std::uint64_t, std::size_t> index;
  struct edge {
    std::size_t to;
    price cost;
  };
  std::vector<std::vector<edge>> edges;
  std::size_t step_cost_mismatches = 0;  // planner's shortcut vs every rank
};

std::uint64_t key_of(layout_value v) {
  std::uint64_t k = 0;
  for (std::size_t a = 0; a < v.axis_count; ++a)
    k = (k << 12U) | (static_cast<std::uint64_t>(v.axes[a].kind) << 10U) |
        (static_cast<std::uint64_t>(static_cast<unsigned char>(v.axes[a].dim)) << 3U) |
        v.axes[a].order;
  return k;
}

graph build_graph(const setting& st) {
  graph g;
  const transition_shape sh = st.shape();
  g.layouts = all_layouts(st.dims, st.sizes.size());
  for (std::size_t i = 0; i < g.layouts.size(); ++i) g.index[key_of(g.layouts[i])] = i;
  REQUIRE(g.index.size() == g.layouts.size());
  g.edges.resize(g.layouts.size());
  for (std::size_t i = 0; i < g.layouts.size(); ++i) {
    for (const auto& [s, next] : steps_from(g.layouts[i], st.dims)) {
      REQUIRE(well_formed(next, st.dims));
      const auto it = g.index.find(key_of(next));
      REQUIRE(it != g.index.end());
      const std::uint64_t worst = worst_rank(s, g.layouts[i], st, sh);
      if (worst != detail::step_cost(s, g.layouts[i], sh)) ++g.step_cost_mismatches;
      g.edges[i].push_back({it->second, price{worst, is_collective(s.kind) ? 1U : 0U}});
    }
  }
  return g;
}

// The least price of reaching every layout from `source` by any sequence of steps:
// relaxation round after round until nothing improves (round k has seen every sequence of
// up to k steps).
std::vector<price> cheapest_from(const graph& g, std::size_t source) {
  std::vector<price> best(g.layouts.size(), unreachable);
  best[source] = {};
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t u = 0; u < g.layouts.size(); ++u) {
      if (best[u] == unreachable) continue;
      for (const auto& e : g.edges[u]) {
        const price c = best[u] + e.cost;
        if (c < best[e.to]) {
          best[e.to] = c;
          changed = true;
        }
      }
    }
  }
  return best;
}

// The same by plain enumeration: every sequence of at most `depth` steps, depth first.
void enumerate(const graph& g, std::size_t at, price paid, int depth, std::vector<price>& best) {
  if (paid < best[at]) best[at] = paid;
  if (depth == 0) return;
  for (const auto& e : g.edges[at]) enumerate(g, e.to, paid + e.cost, depth - 1, best);
}

// Checks a plan against the independent model: valid steps, ends at `to`; returns its price.
bool replay(const transition_plan& plan, layout_value v, layout_value to, const setting& st,
            const transition_shape& sh, price& cost) {
  cost = {};
  for (const auto& s : plan) {
    layout_value next{};
    if (!try_step(v, s, st.dims, next) || !well_formed(next, st.dims)) return false;
    cost = cost + price{worst_rank(s, v, st, sh), is_collective(s.kind) ? 1U : 0U};
    v = next;
  }
  return v == to;
}

std::string describe(const transition_plan& plan) {
  std::string out;
  for (const auto& s : plan) {
    out += std::string(name_of(s.kind)) + "(axis " + std::to_string(s.axis);
    if (s.dim) out += std::string(", ") + s.dim;
    if (s.to_dim) out += std::string(" -> ") + s.to_dim;
    out += ") ";
  }
  return out;
}

struct tally {
  std::size_t pairs = 0, cheaper = 0, failures = 0;
  std::uint64_t saved = 0, fixed_total = 0;
  std::string first_failure;
};

// Plans every (from, to) with `from` in `sources` and compares with the exhaustive search.
void check_setting(const setting& st, tally& t, std::size_t source_stride = 1,
                   int enumerate_depth = 0) {
  const graph g = build_graph(st);
  const transition_shape sh = st.shape();
  CAPTURE(st.name());
  CHECK(g.step_cost_mismatches == 0);  // the planner's maximum is the maximum over all ranks
  for (std::size_t i = 0; i < g.layouts.size(); i += source_stride) {
    const std::vector<price> best = cheapest_from(g, i);
    if (enumerate_depth > 0) {
      std::vector<price> seen(g.layouts.size(), unreachable);
      enumerate(g, i, {}, enumerate_depth, seen);
      CHECK(seen == best);
    }
    for (std::size_t j = 0; j < g.layouts.size(); ++j) {
      layout_value from = g.layouts[i];
      layout_value to = g.layouts[j];
      ++t.pairs;
      const transition_plan plan = cheapest_plan(from, to, sh);
      const transition_plan fixed = fixed_order_plan(from, to);
      price got{}, old{};
      const bool ok = replay(plan, from, to, st, sh, got) && replay(fixed, from, to, st, sh, old);
      const transition_cost claimed = cost_of(plan, from, sh);
      const bool good = ok && got == best[j] && !(old < got) &&
                        (plan.collectives() == 0) == (fixed.collectives() == 0) &&
                        claimed.elements == got.elements;
      if (!good) {
        if (t.failures++ == 0) {
          t.first_failure =
              st.name() + ": " +
              to_string(from, std::array<std::string_view, 4>{"x0", "x1", "x2", "x3"}) + " -> " +
              to_string(to, std::array<std::string_view, 4>{"x0", "x1", "x2", "x3"}) +
              ": planned " + describe(plan) + "= " + std::to_string(got.elements) + " elements, " +
              std::to_string(got.collectives) + " collectives; cheapest " +
              std::to_string(best[j].elements) + ", " + std::to_string(best[j].collectives);
        }
        continue;
      }
      t.fixed_total += old.elements;
      if (got < old) {
        ++t.cheaper;
        t.saved += old.elements - got.elements;
      }
    }
  }
}

void report(const char* what, const tally& t, double seconds) {
  MESSAGE(std::string(what) << ": " << t.pairs << " pairs, " << t.cheaper
                            << " cheaper than the fixed order (" << t.saved << " of "
                            << t.fixed_total << " elements saved), " << seconds << " s");
  INFO(t.first_failure);
  CHECK(t.failures == 0);
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST_CASE("the hand case: 144 B in the fixed order, 96 B planned") {
  CHECK(cost_of(fixed_bm, from_bm, shape_bm).elements * sizeof(float) == 144);
  CHECK(cost_of(cheap_bm, from_bm, shape_bm).elements * sizeof(float) == 96);
  const transition_plan run_time = cheapest_plan(from_bm, to_bm, shape_bm);
  REQUIRE(run_time.size() == 2);
  CHECK(to_string(run_time[0], mesh_t::axis_names) == "all_gather over tp (dim m)");
  CHECK(to_string(run_time[1], mesh_t::axis_names) == "all_to_all over dp (dim b -> m)");
}

TEST_CASE("two more cheaper plans on a 2x2 mesh, with their figures") {
  const auto sizes = std::array<int, 2>{2, 2};
  // Slice first: the all-to-all then moves half as much.
  //   split(a:dp) -> split(b:dp) split(c:tp), "abc" [4x4x4]: 16 elements -> 8.
  {
    using L0 = layout<split<'a', "dp">>;
    using L1 = layout<split<'b', "dp">, split<'c', "tp">>;
    const layout_value from = layout_value_of<mesh_t, "abc", L0>;
    const layout_value to = layout_value_of<mesh_t, "abc", L1>;
    const auto sh =
        make_transition_shape(std::string_view("abc"), std::array<std::size_t, 3>{4, 4, 4}, sizes);
    const transition_plan p = cheapest_plan(from, to, sh);
    CHECK(cost_of(fixed_order_plan(from, to), from, sh).elements == 16);
    CHECK(cost_of(p, from, sh).elements == 8);
    REQUIRE(p.size() == 2);
    CHECK(p[0] == transition_step{step_kind::slice, 1, 'c', 0});
    CHECK(p[1] == transition_step{step_kind::all_to_all, 0, 'a', 'b'});
  }
  // Two pending sums: reduce-scatter one, all-reduce the other on half the data, gather.
  //   partial(dp) partial(tp) -> replicate, "ab" [4x4]: 32 elements -> 24.
  {
    const layout_value from = layout_value_of<mesh_t, "ab", layout<partial<"dp">, partial<"tp">>>;
    const layout_value to = layout_value_of<mesh_t, "ab", layout<>>;
    const auto sh =
        make_transition_shape(std::string_view("ab"), std::array<std::size_t, 2>{4, 4}, sizes);
    const transition_plan p = cheapest_plan(from, to, sh);
    CHECK(cost_of(fixed_order_plan(from, to), from, sh).elements == 32);
    CHECK(cost_of(p, from, sh).elements == 24);
    REQUIRE(p.size() == 3);
    CHECK(p[0] == transition_step{step_kind::reduce_scatter, 0, 'a', 0});
    CHECK(p[1] == transition_step{step_kind::all_reduce, 1, 0, 0});
    CHECK(p[2] == transition_step{step_kind::all_gather, 0, 'a', 0});
  }
}

TEST_CASE("the axes mask keeps the search on the named axes") {
  // partial(dp) -> split(a:dp), "ab" [4x6] on dp=4, tp=2.
  const layout_value from = layout_value_of<mesh_t, "ab", layout<partial<"dp">>>;
  const layout_value to = layout_value_of<mesh_t, "ab", layout<split<'a', "dp">>>;
  const auto sh = make_transition_shape(std::string_view("ab"), std::array<std::size_t, 2>{4, 6},
                                        std::array<int, 2>{4, 2});
  // Through tp's ranks it is cheaper (slice b over tp, reduce-scatter, gather over tp) ...
  const transition_plan any = cheapest_plan(from, to, sh);
  CHECK(any.collectives() == 2);
  // ... but on dp alone it is the one reduce-scatter.
  const transition_plan dp_only = cheapest_plan(from, to, sh, 1U);
  REQUIRE(dp_only.size() == 1);
  CHECK(dp_only[0] == transition_step{step_kind::reduce_scatter, 0, 'a', 0});
  CHECK(cost_of(any, from, sh).elements < cost_of(dp_only, from, sh).elements);
}

TEST_CASE("every layout pair, 1 and 2 mesh axes: no sequence of steps is cheaper") {
  const auto t0 = std::chrono::steady_clock::now();
  tally t;
  const std::vector<setting> settings = {
      {"ab", {12, 12}, {2}},      {"ab", {7, 5}, {3}},         {"abc", {12, 12, 12}, {2}},
      {"abc", {7, 5, 3}, {3}},    {"ab", {12, 12}, {2, 2}},    {"ab", {7, 5}, {2, 2}},
      {"ab", {12, 7}, {2, 3}},    {"ab", {5, 12}, {3, 2}},     {"abc", {12, 12, 12}, {2, 2}},
      {"abc", {7, 5, 3}, {2, 2}}, {"abc", {12, 7, 5}, {2, 3}}, {"abc", {7, 12, 5}, {3, 2}},
      {"abc", {1, 6, 9}, {3, 3}}, {"abc", {2, 3, 50}, {4, 2}},
  };
  for (const auto& st : settings) check_setting(st, t, 1, st.sizes.size() == 1 ? 8 : 0);
  // The relaxation against plain enumeration of every sequence of up to 6 steps.
  check_setting({"ab", {7, 5}, {2, 3}}, t, 1, 6);
  report("1-2 axes", t, since(t0));
}

TEST_CASE("every layout pair, 3 mesh axes: no sequence of steps is cheaper") {
  const auto t0 = std::chrono::steady_clock::now();
  tally t;
  const std::vector<setting> settings = {
      {"ab", {12, 12}, {2, 2, 2}},      {"ab", {7, 5}, {2, 3, 2}},      {"ab", {12, 7}, {3, 2, 2}},
      {"abc", {12, 12, 12}, {2, 2, 2}}, {"abc", {7, 5, 12}, {2, 3, 2}},
  };
  for (const auto& st : settings) check_setting(st, t);
  report("3 axes", t, since(t0));
}

TEST_CASE("a sample of layout pairs on 4 mesh axes") {
  const auto t0 = std::chrono::steady_clock::now();
  tally t;
  // Every 29th, 37th and 211th source layout, against every target layout.
  check_setting({"ab", {12, 12}, {2, 2, 2, 2}}, t, 29);
  check_setting({"ab", {7, 12}, {2, 3, 2, 2}}, t, 37);
  check_setting({"abc", {12, 7, 5}, {2, 2, 2, 2}}, t, 211);
  report("4 axes", t, since(t0));
}

}  // namespace
