// zest/plan/explain.hpp — a plan as text: each collective, its mesh axis, bytes per rank.
//
//   std::cout << zest::explain<"bsm,mh->bsh">(x, w);
//   einsum "bsm,mh->bsh" on mesh<dp=2, tp=2>, policy gather_weights
//     operand 0 "bsm" split(b:dp)                     (kept)
//     operand 1 "mh"  split(m:dp) -> replicate
//       all_gather over dp (dim m)                    1.00 MiB sent by this rank
//     local contraction "bsm,mh->bsh"
//     result "bsh" split(b:dp)
//   total 1.00 MiB sent by this rank in 1 collective
//
// The steps are the plan that evaluation runs: the cheapest for the run-time extents and mesh
// sizes (cheapest_plan, zest/layout/cheapest_plan.hpp); the byte
// figures price each step at this rank with the communicators' ring model
// (zest/comm/communicator.hpp), so a test can compare them with the counters after running
// the same expression.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "zest/einsum/einsum.hpp"
#include "zest/layout/plan_cache.hpp"
#include "zest/layout/shard.hpp"
#include "zest/layout/step.hpp"
#include "zest/layout/step_cost.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest {

struct plan_line {
  int indent = 0;
  std::string text;
  bool communicates = false;
  collective op = collective::all_gather;
  std::string axis;
  std::uint64_t bytes = 0;  // sent by this rank
};

struct plan_report {
  std::string title;
  std::vector<plan_line> lines;

  void note(int indent, std::string text) {
    plan_line l;
    l.indent = indent;
    l.text = std::move(text);
    lines.push_back(std::move(l));
  }
  std::uint64_t bytes() const {
    std::uint64_t b = 0;
    for (const auto& l : lines) b += l.bytes;
    return b;
  }
  std::size_t collectives() const {
    std::size_t n = 0;
    for (const auto& l : lines) n += l.communicates ? 1U : 0U;
    return n;
  }
  std::uint64_t bytes_of(collective k) const {
    std::uint64_t b = 0;
    for (const auto& l : lines) b += (l.communicates && l.op == k) ? l.bytes : 0;
    return b;
  }
  std::string str() const {
    std::ostringstream out;
    out << *this;
    return out.str();
  }
  friend std::ostream& operator<<(std::ostream& out, const plan_report& r) {
    out << r.title << '\n';
    for (const auto& l : r.lines) {
      std::string text(static_cast<std::size_t>(2 * l.indent), ' ');
      text += l.text;
      out << text;
      if (l.communicates) {
        out << std::string(text.size() < 48 ? 48 - text.size() : 1, ' ') << format_bytes(l.bytes)
            << " sent by this rank";
      }
      out << '\n';
    }
    out << "total " << format_bytes(r.bytes()) << " sent by this rank in " << r.collectives()
        << (r.collectives() == 1 ? " collective" : " collectives") << '\n';
    return out;
  }
  static std::string format_bytes(std::uint64_t b) {
    std::ostringstream s;
    if (b < 1024) {
      s << b << " B";
    } else if (b < 1024ULL * 1024) {
      s << std::fixed << std::setprecision(2) << static_cast<double>(b) / 1024.0 << " KiB";
    } else {
      s << std::fixed << std::setprecision(2) << static_cast<double>(b) / (1024.0 * 1024.0)
        << " MiB";
    }
    return s.str();
  }
};

namespace detail {

// Elements this rank holds under layout v (coordinates `coords`).
template <fixed_string Dims, class Mesh, class Extents, class Coords>
std::size_t local_elements(layout_value v, const Extents& global, const Mesh& mesh,
                           const Coords& coords) {
  std::size_t n = 1;
  for (std::size_t i = 0; i < Dims.size(); ++i)
    n *= dim_range(v, Dims[i], global[i], mesh.sizes(), coords).size;
  return n;
}

// Bytes this rank sends for step s from layout v, in the communicators' model: the one
// pricing function, detail::step_elements (zest/layout/step_cost.hpp), at this rank.
template <fixed_string Dims, class Mesh, class Extents>
std::uint64_t step_bytes(const transition_step& s, layout_value v, const Extents& global,
                         const Mesh& mesh, std::size_t element_size) {
  const auto here = mesh.coords();
  mesh_coords coords{};
  for (std::size_t a = 0; a < here.size(); ++a) coords[a] = here[a];
  const std::size_t elements =
      step_elements(s, v, make_transition_shape(Dims, global, mesh.sizes()), coords);
  return static_cast<std::uint64_t>(elements) * element_size;
}

template <fixed_string Dims, class Mesh, class Extents>
void describe_steps(plan_report& r, int indent, const transition_plan& plan, layout_value v,
                    const Extents& global, const Mesh& mesh, std::size_t element_size) {
  for (const auto& s : plan) {
    plan_line line;
    line.indent = indent;
    line.text = to_string(s, Mesh::axis_names);
    line.communicates = is_collective(s.kind);
    if (line.communicates) {
      line.op = collective_of(s.kind);
      line.axis = std::string(Mesh::axis_names[s.axis]);
      line.bytes = step_bytes<Dims>(s, v, global, mesh, element_size);
    }
    r.lines.push_back(std::move(line));
    v = after_step(v, s);
  }
}

template <class X>
std::string tensor_heading(const char* what, const X& x) {
  std::ostringstream s;
  s << what << " \"" << view_of<X::dims> << "\" [";
  for (std::size_t i = 0; i < X::rank; ++i) s << (i ? "x" : "") << x.extents()[i];
  s << "] " << to_string(X::layout, X::mesh_type::axis_names);
  return s.str();
}

template <class P>
constexpr const char* policy_name() {
  if constexpr (std::is_same_v<P, gather_weights>) return "gather_weights";
  else if constexpr (std::is_same_v<P, keep_weights>) return "keep_weights";
  else if constexpr (!P::allows_communication) return "no_communication";
  else return "custom";
}

}  // namespace detail

// The plan of redistribute<Layout>(x).
template <class Layout, sharded_tensor X>
plan_report explain(const X& x) {
  constexpr layout_value to = layout_value_of<typename X::mesh_type, X::dims, Layout>;
  const transition_plan plan = redistribute_plan_for<Layout>(x);  // the plan that will run
  plan_report r;
  r.title = "redistribute on " + x.mesh().describe();
  r.note(1, detail::tensor_heading("tensor", x) + " -> " + to_string(to, X::mesh_type::axis_names));
  detail::describe_steps<X::dims>(r, 2, plan, X::layout, x.extents(), x.mesh(),
                                  sizeof(typename X::value_type));
  if (plan.size() == 0) r.note(2, "nothing to do");
  return r;
}

// The plan of einsum<Spec, O1, O2>(xs...), without running it.
template <fixed_string Spec, class O1 = void, class O2 = void, sharded_tensor... X>
plan_report explain(const X&... xs) {
  static_assert(detail::einsum_valid<Spec, O1, O2, X...>(),
                "zest explain: see the einsum error above");
  using traits = detail::einsum_traits<Spec, O1, O2, X...>;
  static constexpr const einsum_plan& plan = traits::plan;
  using value_type = typename traits::value_type;
  const typename traits::contraction_type::extents_type out_extents =
      detail::checked_output_extents<Spec>(xs...);
  const auto& mesh = std::get<0>(std::forward_as_tuple(xs...)).mesh();
  plan_report r;
  r.title = std::string("einsum \"") + std::string(view_of<Spec>) + "\" on " + mesh.describe() +
            ", policy " + detail::policy_name<typename traits::options::policy>();
  std::size_t operand = 0;
  auto visit = [&](const auto& x) {
    using x_t = std::remove_cvref_t<decltype(x)>;
    const std::size_t i = operand++;
    std::string head = detail::tensor_heading(("operand " + std::to_string(i)).c_str(), x);
    if (plan.operand_steps[i].size() == 0) {
      r.note(1, head + "  (used as it is)");
    } else {
      r.note(1, head + " -> " + to_string(plan.operand_layouts[i], x_t::mesh_type::axis_names));
      // The plan redistribute_to runs for this operand: the cheapest for its extents.
      const transition_plan steps =
          transition_plan_for<x_t::dims>(x_t::layout, plan.operand_layouts[i], x.extents(), mesh);
      detail::describe_steps<x_t::dims>(r, 2, steps, x_t::layout, x.extents(), mesh,
                                        sizeof(value_type));
    }
  };
  (visit(xs), ...);
  r.note(1, "local contraction \"" + std::string(view_of<Spec>) + "\"");
  std::string result = "result \"" + std::string(view_of<traits::out_dims>) + "\" " +
                       to_string(plan.contraction_output, traits::mesh_type::axis_names);
  if (plan.output_steps.size() != 0) {
    r.note(1, result + " -> " + to_string(plan.result, traits::mesh_type::axis_names));
    const transition_plan steps = transition_plan_for<traits::out_dims>(
        plan.contraction_output, plan.result, out_extents, mesh);
    detail::describe_steps<traits::out_dims>(r, 2, steps, plan.contraction_output, out_extents,
                                             mesh, sizeof(value_type));
  } else {
    r.note(1, result);
  }
  return r;
}

}  // namespace zest
