// custom_op — defining your own autodiff operations, one of each kind (docs/ops.md):
//
//   mpiexec -n 2 build/default/examples/custom_op      # x split over dp
//   build/default/examples/custom_op                   # one process
//
//   1. an element-wise op from a value function and its derivative: softplus(x) = log(1 + e^x);
//   2. a row op along a named dim with its backward: y = x - logsumexp(x) along m ("centred
//      log-probabilities", written as a user would, row by row);
//   3. a general op with a backward closure: the squared norm of each row, computed from the
//      tensors' local shards, its gradient 2 x written by hand.
//
// Each runs on any backend (the function objects are ZEST_HOST_DEVICE) and keeps or derives
// its layout: x "bm" split(b:dp), so each rank computes its own rows and nothing is sent.
// The program checks every gradient against central differences of the loss and prints OK or
// MISMATCH (exit code 1 on a mismatch).
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "zest/autodiff/ops.hpp"
#include "zest/zest.hpp"

namespace ad = zest::autodiff;
using zest::dmath::exp;

// 1. softplus: value and derivative (dy/dx, given x and y), callable on host and device.
struct softplus_fn {
  template <class T>
  ZEST_HOST_DEVICE T value(T x) const {
    return x > T(0) ? x + zest::dmath::log(T(1) + exp(-x)) : zest::dmath::log(T(1) + exp(x));
  }
  template <class T>
  ZEST_HOST_DEVICE T derivative(T x, T) const {
    return T(1) / (T(1) + exp(-x));  // the sigmoid
  }
};

// 2. A row op: forward and backward see one row at a time (row[j], j < row.size()).
struct log_normalise_fn {
  template <class T>
  ZEST_HOST_DEVICE void forward(ad::row<const T> x, ad::row<T> y) const {
    T m = x[0];
    for (std::size_t j = 1; j < x.size(); ++j) m = x[j] > m ? x[j] : m;
    T sum = 0;
    for (std::size_t j = 0; j < x.size(); ++j) sum += exp(x[j] - m);
    const T lse = m + zest::dmath::log(sum);
    for (std::size_t j = 0; j < x.size(); ++j) y[j] = x[j] - lse;
  }
  // dx = dy - softmax(x) * sum(dy), softmax(x) = exp(y).
  template <class T>
  ZEST_HOST_DEVICE void backward(ad::row<const T>, ad::row<const T> y, ad::row<const T> dy,
                                 ad::row<T> dx) const {
    T total = 0;
    for (std::size_t j = 0; j < dy.size(); ++j) total += dy[j];
    for (std::size_t j = 0; j < dy.size(); ++j) dx[j] = dy[j] - exp(y[j]) * total;
  }
};

using mesh_t = zest::mesh<"dp">;
using x_t = zest::tensor<double, mesh_t, "bm", zest::layout<zest::split<'b', "dp">>>;
using n_t = zest::tensor<double, mesh_t, "b", zest::layout<zest::split<'b', "dp">>>;

// 3. A general op: any value computed from the inputs' tensors, and a closure that maps the
// result's gradient to the inputs' gradients (any layout of the inputs' dims).
ad::variable<n_t> squared_norm(const ad::variable<x_t>& x) {
  const x_t& xv = x.value();
  n_t y(xv.mesh(), {xv.extents()[0]});
  const auto in = xv.local();
  const std::size_t width = xv.local_extents()[1];
  for (std::size_t r = 0; r < y.local_count(); ++r) {
    double s = 0;
    for (std::size_t j = 0; j < width; ++j) s += in[r * width + j] * in[r * width + j];
    y.local()[r] = s;
  }
  return ad::custom<"squared_norm">(
      std::move(y),
      [](const auto& dy, const n_t&, const x_t& xv) {
        zest::autodiff::dual_tensor<x_t> dx(xv.mesh(), xv.extents());
        const std::size_t w = xv.local_extents()[1];
        for (std::size_t r = 0; r < dy.local_count(); ++r)
          for (std::size_t j = 0; j < w; ++j)
            dx.local()[r * w + j] = 2 * xv.local()[r * w + j] * dy.local()[r];
        return dx;
      },
      x);
}

// loss = sum over b of squared_norm(log_normalise(softplus(x)))
double loss_of(const mesh_t& m, const std::vector<double>& values, std::vector<double>* grad) {
  ad::tape t;
  auto x = t.parameter(x_t::from_global(m, {5, 4}, values));
  auto a = ad::unary<"softplus">(x, softplus_fn{});
  auto p = ad::rowwise<'m', "log_normalise">(a, log_normalise_fn{});
  auto loss = ad::sum(squared_norm(p));
  if (grad) {
    ad::backward(loss);
    const auto g = zest::to_global(x.grad());
    grad->assign(g.begin(), g.end());
  }
  return zest::to_global(loss.value())[0];
}

int main(int argc, char** argv) {
  zest::mpi_environment env(&argc, &argv);
  int ranks = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  mesh_t m(MPI_COMM_WORLD, {ranks});
  std::vector<double> x(20);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(1.7 * static_cast<double>(i)) * 2;
  std::vector<double> grad;
  const double loss = loss_of(m, x, &grad);
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    auto plus = x, minus = x;
    plus[i] += 1e-6;
    minus[i] -= 1e-6;
    const double fd = (loss_of(m, plus, nullptr) - loss_of(m, minus, nullptr)) / 2e-6;
    worst = std::max(worst, std::abs(fd - grad[i]) / std::max(1.0, std::abs(fd)));
  }
  const bool ok = worst < 1e-6;
  if (rank == 0) {
    std::printf("custom_op on %d rank(s): loss %.6f, gradient vs central differences %.2e: %s\n",
                ranks, loss, worst, ok ? "OK" : "MISMATCH");
  }
  return ok ? 0 : 1;
}
