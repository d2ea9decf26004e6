// zest/backend/host/gemm.hpp — strided batched GEMM on the host, row-major.
//
// For p in [0, batch):
//   C_p = alpha * op(A_p) * op(B_p) + beta * C_p,   X_p = x + p * stride_x,
// op(A) is m x k (A stored k x m when trans_a), op(B) is k x n (B stored n x k when
// trans_b), C is m x n; every matrix is row-major with its leading dimension (the distance
// between rows). A stride of 0 shares that operand across the batch:
//
//   // out[b][h][s] = sum_m x[b][s][m] * w[h][m]   (einsum "bsm,hm->bhs")
//   gemm_strided_batched(false, true, H, S, M, 1.0f, w, M, 0, x, M, S * M,
//                        0.0f, out, S, H * S, B);
//
// float and double call cblas_sgemm/cblas_dgemm when ZEST_HAS_BLAS, else Eigen; bfloat16
// converts to float, computes in float and rounds back. When beta == 0, C is not read
// (NaNs in it do not propagate), as in BLAS.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "zest/backend/contraction_plan.hpp"
#include "zest/config.hpp"
#include "zest/core/bfloat16.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"

#include "zest/backend/host/blas.hpp"
#if __has_include(<Eigen/Core>)
#include <Eigen/Core>
#define ZEST_HOST_GEMM_HAS_EIGEN 1
#else
#define ZEST_HOST_GEMM_HAS_EIGEN 0
#endif

namespace zest::host {

namespace detail {

// Below contraction::small_gemm_volume multiply-adds (zest/backend/contraction_plan.hpp: the
// planner's cost model counts on it) a call into BLAS costs more than the arithmetic; small
// products (batched dot products, outer products of short vectors) run in plain loops.
using contraction::small_gemm_volume;

// Loops in the compute type; for small products and as the last resort.
template <class T>
void gemm_loops(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k,
                compute_type_t<T> alpha, const T* a, std::size_t lda, const T* b, std::size_t ldb,
                compute_type_t<T> beta, T* c, std::size_t ldc) {
  using acc_t = compute_type_t<T>;
  const std::size_t a_row = trans_a ? 1 : lda, a_col = trans_a ? lda : 1;
  const std::size_t b_row = trans_b ? 1 : ldb, b_col = trans_b ? ldb : 1;
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      acc_t sum = 0;
      for (std::size_t p = 0; p < k; ++p) {
        sum += static_cast<acc_t>(a[i * a_row + p * a_col]) *
               static_cast<acc_t>(b[p * b_row + j * b_col]);
      }
      T& out = c[i * ldc + j];
      out = beta == acc_t(0) ? T(alpha * sum) : T(alpha * sum + beta * static_cast<acc_t>(out));
    }
  }
}

#if ZEST_HOST_GEMM_HAS_EIGEN
// One product through Eigen (used when no BLAS is linked; correct for any strides).
template <class T>
void gemm_eigen(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha,
                const T* a, std::size_t lda, const T* b, std::size_t ldb, T beta, T* c,
                std::size_t ldc) {
  using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using stride = Eigen::OuterStride<>;
  using const_map = Eigen::Map<const matrix, Eigen::Unaligned, stride>;
  const auto ei = [](std::size_t x) { return static_cast<Eigen::Index>(x); };
  const const_map am(a, ei(trans_a ? k : m), ei(trans_a ? m : k), stride(ei(lda)));
  const const_map bm(b, ei(trans_b ? n : k), ei(trans_b ? k : n), stride(ei(ldb)));
  Eigen::Map<matrix, Eigen::Unaligned, stride> cm(c, ei(m), ei(n), stride(ei(ldc)));
  const auto assign = [&](const auto& op_a, const auto& op_b) {
    if (beta == T(0)) {
      cm.noalias() = (alpha * op_a) * op_b;
    } else {
      cm *= beta;
      cm.noalias() += (alpha * op_a) * op_b;
    }
  };
  if (trans_a && trans_b) assign(am.transpose(), bm.transpose());
  else if (trans_a) assign(am.transpose(), bm);
  else if (trans_b) assign(am, bm.transpose());
  else assign(am, bm);
}
#endif

// One float/double product on the best available engine.
template <class T>
void gemm_one(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha,
              const T* a, std::size_t lda, const T* b, std::size_t ldb, T beta, T* c,
              std::size_t ldc) {
  if (m * n * k <= small_gemm_volume) {
    gemm_loops<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
#if ZEST_HAS_BLAS
  const auto bi = [](std::size_t x) { return static_cast<int>(x); };
  const int ta = trans_a ? blas::trans : blas::no_trans;
  const int tb = trans_b ? blas::trans : blas::no_trans;
  // A product with one output row or column is a matrix-vector product; GEMV streams the
  // matrix once where GEMM would pack it first (about twice as fast for "ij,j->i").
  if (n == 1 || m == 1) {
    const auto gemv = [](int t, std::size_t rows, std::size_t cols, T alpha_, const T* mat,
                         std::size_t ld, const T* x, std::size_t incx, T beta_, T* y,
                         std::size_t incy) {
      const auto i = [](std::size_t v) { return static_cast<int>(v); };
      if constexpr (std::is_same_v<T, float>) {
        blas::sgemv(blas::row_major, t, i(rows), i(cols), alpha_, mat, i(ld), x, i(incx), beta_, y,
                    i(incy));
      } else {
        blas::dgemv(blas::row_major, t, i(rows), i(cols), alpha_, mat, i(ld), x, i(incx), beta_, y,
                    i(incy));
      }
    };
    if (n == 1) {  // c[i * ldc] = sum_p op(A)[i, p] * op(B)[p, 0]
      gemv(ta, trans_a ? k : m, trans_a ? m : k, alpha, a, lda, b, trans_b ? 1 : ldb, beta, c, ldc);
    } else {  // c[j] = sum_p op(A)[0, p] * op(B)[p, j], i.e. op(B)^T times a row
      gemv(trans_b ? blas::no_trans : blas::trans, trans_b ? n : k, trans_b ? k : n, alpha, b, ldb,
           a, trans_a ? lda : 1, beta, c, 1);
    }
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    blas::sgemm(blas::row_major, ta, tb, bi(m), bi(n), bi(k), alpha, a, bi(lda), b, bi(ldb), beta,
                c, bi(ldc));
  } else {
    blas::dgemm(blas::row_major, ta, tb, bi(m), bi(n), bi(k), alpha, a, bi(lda), b, bi(ldb), beta,
                c, bi(ldc));
  }
#elif ZEST_HOST_GEMM_HAS_EIGEN
  gemm_eigen<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  gemm_loops<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

// Copies a rows x cols row-major matrix with leading dimension ld into a dense float one.
template <class T>
void to_float(const T* x, std::size_t rows, std::size_t cols, std::size_t ld, float* out) {
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t col = 0; col < cols; ++col) out[r * cols + col] = float(x[r * ld + col]);
  }
}

// A leading dimension only matters when the stored matrix has more than one row; BLAS still
// insists on ld >= cols, so a single row gets cols. A real ld smaller than that would make
// rows overlap: a caller bug, reported instead of passed on.
inline std::size_t checked_ld(const char* name, std::size_t ld, std::size_t rows,
                              std::size_t cols) {
  const std::size_t need = std::max<std::size_t>(cols, 1);
  if (rows <= 1) return std::max(ld, need);
  if (ld < need) {
    throw shape_error(zest::detail::message("zest: gemm_strided_batched: ", name, " = ", ld,
                                            " is smaller than the row length ", cols));
  }
  return ld;
}

}  // namespace detail

template <class T>
void gemm_strided_batched(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k,
                          compute_type_t<T> alpha, const T* a, std::size_t lda,
                          std::size_t stride_a, const T* b, std::size_t ldb, std::size_t stride_b,
                          compute_type_t<T> beta, T* c, std::size_t ldc, std::size_t stride_c,
                          std::size_t batch) {
  static_assert(
      std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bfloat16>,
      "zest::host::gemm_strided_batched: element type must be float, double or "
      "zest::bfloat16");
  using acc_t = compute_type_t<T>;
  if (m == 0 || n == 0 || batch == 0) return;
  const std::size_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const std::size_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  lda = detail::checked_ld("lda", lda, a_rows, a_cols);
  ldb = detail::checked_ld("ldb", ldb, b_rows, b_cols);
  ldc = detail::checked_ld("ldc", ldc, m, n);
#if ZEST_HAS_BLAS
  if (std::max({m, n, k, lda, ldb, ldc}) > static_cast<std::size_t>(INT_MAX)) {
    throw shape_error(zest::detail::message("zest: gemm_strided_batched: a size or leading ",
                                            "dimension exceeds the BLAS integer range"));
  }
#endif
  if (k == 0) {
    // Empty sum: C = beta * C (BLAS would do the same; done here to not depend on it).
    for (std::size_t p = 0; p < batch; ++p) {
      T* cp = c + p * stride_c;
      for (std::size_t i = 0; i < m; ++i) {
        for (std::size_t j = 0; j < n; ++j) {
          T& x = cp[i * ldc + j];
          x = beta == acc_t(0) ? T(acc_t(0)) : T(beta * static_cast<acc_t>(x));
        }
      }
    }
    return;
  }
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (m * n * k <= detail::small_gemm_volume) {
      for (std::size_t p = 0; p < batch; ++p) {
        detail::gemm_loops<T>(trans_a, trans_b, m, n, k, alpha, a + p * stride_a, lda,
                              b + p * stride_b, ldb, beta, c + p * stride_c, ldc);
      }
      return;
    }
    // Convert one batch entry at a time: the buffers stay the size of one product, and an
    // operand shared across the batch (stride 0) is converted once.
    std::vector<float> fa(a_rows * a_cols), fb(b_rows * b_cols), fc(m * n);
    for (std::size_t p = 0; p < batch; ++p) {
      if (p == 0 || stride_a != 0)
        detail::to_float(a + p * stride_a, a_rows, a_cols, lda, fa.data());
      if (p == 0 || stride_b != 0)
        detail::to_float(b + p * stride_b, b_rows, b_cols, ldb, fb.data());
      T* cp = c + p * stride_c;
      if (beta != 0.0F) detail::to_float(cp, m, n, ldc, fc.data());
      detail::gemm_one<float>(trans_a, trans_b, m, n, k, alpha, fa.data(), a_cols, fb.data(),
                              b_cols, beta, fc.data(), n);
      for (std::size_t i = 0; i < m; ++i) {
        for (std::size_t j = 0; j < n; ++j) cp[i * ldc + j] = bfloat16(fc[i * n + j]);
      }
    }
  } else {
    for (std::size_t p = 0; p < batch; ++p) {
      detail::gemm_one<T>(trans_a, trans_b, m, n, k, alpha, a + p * stride_a, lda, b + p * stride_b,
                          ldb, beta, c + p * stride_c, ldc);
    }
  }
}

}  // namespace zest::host
