// zest/autodiff/checkpoint.hpp — activation recomputation: a function's internals are not kept
// from forward to backward; backward runs the function again to rebuild them.
//
//   auto body = [&w1, &w2](const autodiff::variable<X>& x) {   // captures live until backward
//     return einsum<"bth,hm->btm">(gelu(einsum<"btm,mh->bth">(x, w1.value())), w2.value());
//   };
//   auto y = autodiff::checkpoint(body, x);                     // y = body(x), internals freed
//   auto z = autodiff::checkpoint_if(mode == recomputation::full, body, x);  // or body(x)
//
// Forward: body(inputs...) runs while the tape records into a region of its own
// (tape::begin_region); when it returns, the region's backward steps are dropped, and with them
// every tensor they held (a step keeps its operands' and its output's nodes alive). What stays
// is the output and, in the one step recorded on the tape, the input variables and the
// function. Backward, once the output's gradient is complete: body(inputs...) runs again on the
// same input variables, its steps are recorded into a new region, the output's gradient is
// handed to the new output, and the steps run in reverse; then they are dropped too.
//
// The recomputation reads what the first run read: the input variables' values (kept) and
// whatever the function captured — parameters as they are at that point of backward. Under
// ZeRO-3 the engine gathers a group's parameters again just before the group's backward steps
// (zero/engine.hpp); a checkpoint inside a group's scope runs after that gather, so its
// recomputation uses those values and costs no second gather. The engine refuses a group
// entered inside a checkpointed function: the scope goes outside, the body inside.
//
// Bit for bit: the recomputed forward does the same operations on the same values (randomness
// must come from seeds, as zest's counter-based dropout does), the recomputed steps are the
// steps the first run recorded, in the same order, and the gradients reach the inputs' nodes
// as they would have; so gradients, losses and parameters are exactly those without
// recomputation. The recomputed output is compared with the first bit for bit, on every
// backend (the backend's sum of kernels::bits_differ: on a GPU one reduction kernel and a
// wait): a function that is not deterministic is an error, not a silently wrong gradient.
//
// Requirements, checked: the inputs are variables of one tape; the function returns one
// variable; no variable made inside it is used outside it except the output (one that
// receives a gradient from outside is an error in backward: a dropped step would not carry
// it on; return it, or compute it outside).
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "zest/autodiff/kernels.hpp"
#include "zest/autodiff/tape.hpp"
#include "zest/backend/backend.hpp"
#include "zest/core/error.hpp"

namespace zest::autodiff {

namespace detail {

template <class T>
struct is_variable : std::false_type {};
template <sharded_tensor X>
struct is_variable<variable<X>> : std::true_type {};

// Runs f(args...) with a region open on t; closes it whatever happens.
template <class F, class Tuple>
auto run_in_region(tape& t, F& f, const Tuple& args, tape::region& out) {
  t.begin_region();
  try {
    auto y = std::apply(f, args);
    out = t.end_region();
    return y;
  } catch (...) {
    (void)t.end_region();
    throw;
  }
}

// How many elements of two tensors' local shards differ in some bit (the size of the larger
// when their sizes differ), counted by the shards' backend.
template <sharded_tensor Y>
std::size_t bits_differing(const Y& a, const Y& b) {
  const auto pa = a.local();
  const auto pb = b.local();
  if (pa.size() != pb.size()) return std::max(pa.size(), pb.size());
  using T = typename Y::value_type;
  const double count = sum_kernel<typename Y::backend_type>(
      pa.size(), kernels::bits_differ<T>{pa.data(), pb.data()});
  return static_cast<std::size_t>(count);
}

}  // namespace detail

// y = fn(inputs...), recomputed in backward instead of kept (see the top of the file).
template <class F, sharded_tensor... X>
auto checkpoint(F fn, const variable<X>&... inputs) {
  static_assert(sizeof...(X) >= 1,
                "zest autodiff::checkpoint(fn, inputs...): give at least one input variable; "
                "the tape is the inputs' tape");
  using result = std::invoke_result_t<F&, const variable<X>&...>;
  static_assert(detail::is_variable<std::remove_cvref_t<result>>::value,
                "zest autodiff::checkpoint(fn, inputs...): fn must return one "
                "autodiff::variable (the output whose gradient backward brings)");
  using Y = typename std::remove_cvref_t<result>::tensor_type;

  const auto args = std::make_tuple(inputs...);
  tape& t = std::get<0>(args).owner();
  if (((&inputs.owner() != &t) || ...)) {
    throw std::logic_error(
        "zest autodiff::checkpoint: the inputs are variables of different tapes; a checkpointed "
        "function records on the one tape its inputs share");
  }

  tape::region first;
  variable<Y> y = detail::run_in_region(t, fn, args, first);
  // Nothing to rebuild: no gradient flows through y, or fn returned a variable made outside.
  const auto output = std::find_if(first.made.begin(), first.made.end(), [&](const auto& m) {
    return m.node.lock().get() == static_cast<const void*>(y.node().get());
  });
  if (!y.requires_grad() || output == first.made.end()) return y;
  t.note_made(*output);  // made in the enclosing region too, when checkpoints nest
  std::vector<tape::made_variable> made = std::move(first.made);
  first.steps.clear();  // the internals go here

  t.record([fn = std::move(fn), args, yn = y.node(), made = std::move(made)]() mutable {
    if (!yn->grad) return;
    for (const auto& m : made) {
      const auto node = m.node.lock();
      if (node && node.get() != static_cast<const void*>(yn.get()) && m.has_gradient(node.get())) {
        throw std::logic_error(
            "zest autodiff::checkpoint: a variable made inside the checkpointed function, other "
            "than its output, received a gradient from outside it (kept by a layer and used "
            "later, e.g. an auxiliary loss); its backward steps were dropped, so the gradient "
            "would stop there. Fix: return it from the function, or compute it outside");
      }
    }
    tape& owner = std::get<0>(args).owner();
    tape::region again;
    variable<Y> y2 = detail::run_in_region(owner, fn, args, again);
    if (y2.value().extents() != yn->value.extents()) {
      throw std::logic_error(
          "zest autodiff::checkpoint: the recomputed output has other extents than the first "
          "run's; the function must compute the same thing again");
    }
    if (const std::size_t differ = detail::bits_differing(y2.value(), yn->value); differ != 0) {
      throw std::logic_error(zest::detail::message(
          "zest autodiff::checkpoint: the recomputed output differs from the first run's in ",
          differ, " of ", yn->value.local_count(),
          " elements of this rank's shard: the function is not deterministic (random numbers "
          "not drawn from a seed, or state it reads changed between forward and backward)"));
    }
    y2.node()->grad = std::move(yn->grad);
    yn->grad.reset();
    tape::run_and_release(again.steps);
  });
  return y;
}

// checkpoint(fn, inputs...) when `recompute`, else fn(inputs...): a layer's switch.
template <class F, sharded_tensor... X>
auto checkpoint_if(bool recompute, F fn, const variable<X>&... inputs)
    -> std::remove_cvref_t<std::invoke_result_t<F&, const variable<X>&...>> {
  if (recompute) return checkpoint(std::move(fn), inputs...);
  return fn(inputs...);
}

}  // namespace zest::autodiff
