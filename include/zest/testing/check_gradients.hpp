// zest/testing/check_gradients.hpp — finite-difference gradient checks for users' ops and layers.
//
//   namespace ad = zest::autodiff;
//   auto loss = [&](ad::tape& t, const auto& x, const auto& w) {      // one variable per input
//     return zest::testing::weighted_sum(t, my_layer(ad::einsum<"bsm,mh->bsh">(x, w)));
//   };
//   auto report = zest::testing::check_gradients(loss, x, w);          // x, w: sharded tensors
//   if (!report) std::cerr << report;   // names the input, the global index and both values
//
//   zest::testing::check_gradients({.names = {"x", "w"}, .rtol = 1e-5}, loss, x, w);
//
// The loss function builds a scalar from variables on a tape: f(tape&, const variable<X>&...)
// (or f(const variable<X>&...)), one variable per input, in order, returning a rank-0
// variable of any layout (a pending sum is added up). check_gradients runs it once with
// backward() for the gradients the tape computes, then, for every element of every input
// (or an evenly spaced sample, `max_elements`), twice more with that element moved by -h and
// +h, and compares each gradient with the central difference (L(x + h) - L(x - h)) / 2h,
// computed in double:
//
//   |backward - numeric| <= atol + rtol * max(|backward|, |numeric|)
//
// Inputs may have any layout on any mesh, partial included (the perturbation goes to the
// summand on coordinate 0 of the partial axes, so the value moves by h). On several ranks
// every rank runs the same evaluations and perturbs the same global element, each on its own
// shard; the loss is a replicated scalar and the gradients are gathered whole, so every rank
// computes the same report. The loss function must therefore be deterministic and must not
// depend on the rank beyond what its layouts imply.
//
// Checks are meaningful in double: there the defaults are h = 1e-6 * max(1, |x|),
// rtol = 1e-6, atol = 1e-8. Float inputs get h = 1e-2 * max(1, |x|), rtol = atol = 1e-2,
// which catch a wrong formula but not a small error; bfloat16 and float16 have too few digits
// and do not compile.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/autodiff/tape.hpp"
#include "zest/backend/backend.hpp"
#include "zest/core/random.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest::testing {

struct gradient_check_options {
  // Names of the inputs in the report, in order; an input without a name is "input <i>".
  std::vector<std::string> names{};
  // The step, relative: h = step * max(1, |x|). Default 1e-6 (double), 1e-2 (float).
  std::optional<double> step{};
  // Tolerances (see the top of this file). Defaults 1e-6 and 1e-8 (double), 1e-2 (float).
  std::optional<double> rtol{};
  std::optional<double> atol{};
  // At most this many elements of each input are checked, evenly spaced over the flat
  // global index, the first and last included; 0 checks every element.
  std::size_t max_elements = 0;
  // The report keeps the first this many mismatches (it counts all of them).
  std::size_t max_reported = 8;
};

// One element whose gradient disagrees with its central difference.
struct gradient_mismatch {
  std::size_t input = 0;           // position among the inputs
  std::string name;                // the input's name
  std::string tensor;              // its dims and layout: "mh" split(m:dp)
  std::string dims;                // "mh"
  std::vector<std::size_t> index;  // the global index, one entry per dim
  std::size_t flat = 0;            // the row-major position of `index`
  double backward = 0;             // the gradient the tape computed
  double numeric = 0;              // the central difference
  double tolerance = 0;            // atol + rtol * max(|backward|, |numeric|)

  // input "w" ("mh" split(m:dp)) at [m=3, h=1]: backward 0.5, central difference 0.25
  // (difference 0.25, tolerance 2.5e-07)
  std::string describe() const {
    std::ostringstream s;
    s.precision(10);
    s << "input \"" << name << "\" (" << tensor << ") at [";
    for (std::size_t k = 0; k < index.size(); ++k)
      s << (k ? ", " : "") << (k < dims.size() ? dims[k] : '?') << '=' << index[k];
    s << "]: backward " << backward << ", central difference " << numeric << " (difference "
      << std::abs(backward - numeric) << ", tolerance " << tolerance << ')';
    return s.str();
  }
};

struct gradient_report {
  double loss = 0;                            // the unperturbed loss
  std::size_t checked = 0;                    // elements compared, all inputs
  std::size_t failed = 0;                     // of which disagreed
  double worst_ratio = 0;                     // the largest |difference| / tolerance
  std::vector<gradient_mismatch> mismatches;  // the first max_reported of them

  bool ok() const { return failed == 0; }
  explicit operator bool() const { return ok(); }

  std::string message() const {
    std::ostringstream s;
    s.precision(10);
    if (ok()) {
      s << "check_gradients: " << checked << " elements agree with central differences (loss "
        << loss << "; the largest difference is " << worst_ratio << " of its tolerance)";
      return s.str();
    }
    s << "check_gradients: " << failed << " of " << checked
      << " elements disagree with central differences (loss " << loss
      << "; the largest difference is " << worst_ratio << " times its tolerance)";
    for (const auto& m : mismatches) s << "\n  " << m.describe();
    if (failed > mismatches.size()) s << "\n  ... and " << failed - mismatches.size() << " more";
    return s.str();
  }
  friend std::ostream& operator<<(std::ostream& out, const gradient_report& r) {
    return out << r.message();
  }
};

// loss = sum(y * R) for fixed pseudo-random weights R in [0.5, 1.5), a function of the
// global index and `seed` (the same on every rank and for every layout of y): a scalar
// whose gradient with respect to y is R, so that every element of y counts with its own
// weight (a plain sum(y) hides gradients that are wrong by a permutation).
template <sharded_tensor Y>
auto weighted_sum(autodiff::tape& t, const autodiff::variable<Y>& y, std::uint64_t seed = 1) {
  using T = typename Y::value_type;
  using mesh_t = typename Y::mesh_type;
  using r_t = basic_tensor<T, mesh_t, Y::dims, replicated_layout(mesh_t::axis_count)>;
  const auto& e = y.value().extents();
  auto r = r_t::generate(y.value().mesh(), e, [&](const auto& i) {
    std::uint64_t flat = 0;
    for (std::size_t k = 0; k < Y::rank; ++k) flat = flat * e[k] + i[k];
    const std::uint64_t bits = splitmix64(flat * 0x9E3779B97F4A7C15ULL + seed);
    return static_cast<T>(0.5 + static_cast<double>(bits >> 11U) * 0x1.0p-53);
  });
  return autodiff::sum(y * t.constant(std::move(r)));
}

namespace detail {

template <class T>
struct gradient_defaults;
template <>
struct gradient_defaults<double> {
  static constexpr double step = 1e-6, rtol = 1e-6, atol = 1e-8;
};
template <>
struct gradient_defaults<float> {
  static constexpr double step = 1e-2, rtol = 1e-2, atol = 1e-2;
};

template <class T>
inline constexpr bool checkable_element = std::is_same_v<T, double> || std::is_same_v<T, float>;

template <class F, class... X>
constexpr int loss_form() {
  if constexpr (std::is_invocable_v<F&, autodiff::tape&, const autodiff::variable<X>&...>) {
    return 1;
  } else if constexpr (std::is_invocable_v<F&, const autodiff::variable<X>&...>) {
    return 2;
  } else {
    return 0;
  }
}

template <class V>
struct is_scalar_variable : std::false_type {};
template <class L>
struct is_scalar_variable<autodiff::variable<L>> : std::bool_constant<L::rank == 0> {};

template <class F, class... X>
auto call_loss(F& f, autodiff::tape& t, const autodiff::variable<X>&... v) {
  if constexpr (loss_form<F, X...>() == 1) {
    return f(t, v...);
  } else {
    return f(v...);
  }
}

// The loss of one evaluation; with `grads`, also backward() and each input's whole gradient.
template <class F, class... X>
double evaluate(F& f, const std::tuple<X...>& inputs, std::vector<std::vector<double>>* grads) {
  autodiff::tape t;
  return std::apply(
      [&](const X&... x) {
        auto vars = std::make_tuple(t.parameter(X(x))...);
        return std::apply(
            [&](const auto&... v) {
              auto loss = call_loss(f, t, v...);
              const double value = static_cast<double>(to_global(loss.value())[0]);
              if (grads != nullptr) {
                autodiff::backward(loss);
                grads->clear();
                auto gather = [&](const auto& var) {
                  std::vector<double> g;
                  if (var.has_gradient()) {
                    const auto whole = to_global(var.grad());
                    g.assign(whole.begin(), whole.end());
                  } else {
                    g.assign(var.value().size(), 0.0);  // the loss does not depend on it
                  }
                  grads->push_back(std::move(g));
                };
                (gather(v), ...);
              }
              return value;
            },
            vars);
      },
      inputs);
}

// x with the global element at `flat` moved by `delta`, on the rank that holds it (on
// partial axes: the summand of coordinate 0).
template <sharded_tensor X>
X moved(const X& x, std::size_t flat, double delta) {
  using T = typename X::value_type;
  X out = x;
  if (!out.holds_partial_summand()) return out;
  const auto& e = out.extents();
  const auto& lo = out.local_offsets();
  const auto& le = out.local_extents();
  std::size_t rest = flat, local = 0, local_stride = 1;
  for (std::size_t k = X::rank; k-- > 0;) {
    const std::size_t i = rest % e[k];
    rest /= e[k];
    if (i < lo[k] || i >= lo[k] + le[k]) return out;  // another rank's element
    local += (i - lo[k]) * local_stride;
    local_stride *= le[k];
  }
  // The one element seen from the host: in place on the host backend, a copy written back
  // elsewhere (host_staging, zest/backend/backend.hpp).
  host_staging<typename X::backend_type, T> element(out.local().subspan(local, 1));
  T& value = element.host()[0];
  value = static_cast<T>(static_cast<double>(value) + delta);
  element.write_back();
  return out;
}

template <sharded_tensor X>
std::string tensor_text() {
  return '"' + std::string(view_of<X::dims>) + "\" " + layout_string<X>();
}

template <class F, class... X>
gradient_report check(const gradient_check_options& options, F& f, const X&... xs) {
  // The defaults of the least precise input.
  using T =
      std::conditional_t<(std::is_same_v<typename X::value_type, float> || ...), float, double>;
  const std::tuple<const X&...> refs(xs...);
  const std::tuple<X...> base(xs...);
  std::vector<std::vector<double>> grads;
  gradient_report report;
  report.loss = evaluate(f, base, &grads);

  const double rel_step = options.step.value_or(gradient_defaults<T>::step);
  const double rtol = options.rtol.value_or(gradient_defaults<T>::rtol);
  const double atol = options.atol.value_or(gradient_defaults<T>::atol);

  auto check_input = [&]<std::size_t I>(std::integral_constant<std::size_t, I>) {
    using x_t = std::tuple_element_t<I, std::tuple<X...>>;
    const x_t& x = std::get<I>(refs);
    const auto whole = to_global(x);
    const std::size_t count = whole.size();
    std::size_t picks = count;
    if (options.max_elements != 0 && options.max_elements < count) picks = options.max_elements;
    for (std::size_t k = 0; k < picks; ++k) {
      const std::size_t flat =
          picks == count ? k : (picks == 1 ? 0 : k * (count - 1) / (picks - 1));
      const double value = static_cast<double>(whole[flat]);
      // A step the element type represents exactly near x: x + h - x == h.
      const double wanted = rel_step * std::max(1.0, std::abs(value));
      const double h =
          static_cast<double>(static_cast<typename x_t::value_type>(value + wanted)) - value;
      double numeric = 0;
      {
        std::tuple<X...> plus = base, minus = base;
        std::get<I>(plus) = moved(x, flat, h);
        std::get<I>(minus) = moved(x, flat, -h);
        numeric = (evaluate(f, plus, nullptr) - evaluate(f, minus, nullptr)) / (2 * h);
      }
      const double backward = grads[I][flat];
      const double tolerance = atol + rtol * std::max(std::abs(backward), std::abs(numeric));
      const double difference = std::abs(backward - numeric);
      ++report.checked;
      const bool bad = !(difference <= tolerance);  // a NaN fails
      const double ratio = std::isfinite(difference) ? difference / tolerance
                                                     : std::numeric_limits<double>::infinity();
      report.worst_ratio = std::max(report.worst_ratio, ratio);
      if (!bad) continue;
      ++report.failed;
      if (report.mismatches.size() >= options.max_reported) continue;
      gradient_mismatch m;
      m.input = I;
      m.name = I < options.names.size() ? options.names[I] : "input " + std::to_string(I);
      m.tensor = tensor_text<x_t>();
      m.dims = std::string(view_of<x_t::dims>);
      m.index.resize(x_t::rank);
      std::size_t rest = flat;
      for (std::size_t d = x_t::rank; d-- > 0;) {
        m.index[d] = rest % x.extents()[d];
        rest /= x.extents()[d];
      }
      m.flat = flat;
      m.backward = backward;
      m.numeric = numeric;
      m.tolerance = tolerance;
      report.mismatches.push_back(std::move(m));
    }
  };
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (check_input(std::integral_constant<std::size_t, I>{}), ...);
  }
  (std::index_sequence_for<X...>{});
  return report;
}

template <class F, class... X>
constexpr bool check_signature() {
  static_assert(sizeof...(X) > 0,
                "zest check_gradients: no inputs to perturb. Fix: pass the tensors after the "
                "loss function, check_gradients(loss, x, w)");
  static_assert((checkable_element<typename X::value_type> && ...),
                "zest check_gradients: inputs must hold double (or float) elements; bfloat16 "
                "and float16 have too few digits for central differences. Fix: check the op "
                "on double tensors");
  static_assert(loss_form<F, X...>() != 0,
                "zest check_gradients: the loss function must be callable as "
                "f(zest::autodiff::tape&, const zest::autodiff::variable<X>&...) or "
                "f(const zest::autodiff::variable<X>&...), one variable per input in order");
  if constexpr (loss_form<F, X...>() != 0) {
    using result =
        std::remove_cvref_t<decltype(call_loss(std::declval<F&>(), std::declval<autodiff::tape&>(),
                                               std::declval<const autodiff::variable<X>&>()...))>;
    static_assert(is_scalar_variable<result>::value,
                  "zest check_gradients: the loss function must return a scalar variable (a "
                  "rank-0 autodiff::variable). Fix: end it with autodiff::sum(...) or "
                  "zest::testing::weighted_sum(t, y)");
    return is_scalar_variable<result>::value;
  }
  return false;
}

}  // namespace detail

// Compares the tape's gradient of loss(inputs...) with respect to each input with central
// differences; see the top of this file.
template <class F, sharded_tensor... X>
gradient_report check_gradients(const gradient_check_options& options, F&& loss,
                                const X&... inputs) {
  if constexpr (detail::check_signature<std::remove_reference_t<F>, X...>()) {
    return detail::check(options, loss, inputs...);
  } else {
    return {};
  }
}
template <class F, sharded_tensor... X>
gradient_report check_gradients(F&& loss, const X&... inputs) {
  return check_gradients(gradient_check_options{}, std::forward<F>(loss), inputs...);
}

}  // namespace zest::testing
