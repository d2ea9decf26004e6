// zest/backend/host/blas.hpp — the four CBLAS routines zest calls, declared by zest.
//
// Including <cblas.h> from a zest header would hand every user OpenBLAS's global
// `typedef uint16_t bfloat16`, which makes `using namespace zest; bfloat16 x;` ambiguous.
// So zest declares the routines under its own names, bound to the CBLAS symbols by an
// assembler label; a program may still include <cblas.h> itself without any conflict.
// Arguments follow the CBLAS ABI with 32-bit integers (OpenBLAS's LP64 build, Debian's).
#pragma once

#include "zest/config.hpp"

#if ZEST_HAS_BLAS

namespace zest::host::blas {

// CBLAS enumerators (the values every CBLAS uses).
inline constexpr int row_major = 101;
inline constexpr int no_trans = 111;
inline constexpr int trans = 112;

extern "C" {
void sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a,
           int lda, const float* b, int ldb, float beta, float* c, int ldc) __asm__("cblas_sgemm");
void dgemm(int order, int trans_a, int trans_b, int m, int n, int k, double alpha, const double* a,
           int lda, const double* b, int ldb, double beta, double* c,
           int ldc) __asm__("cblas_dgemm");
void sgemv(int order, int trans, int m, int n, float alpha, const float* a, int lda, const float* x,
           int incx, float beta, float* y, int incy) __asm__("cblas_sgemv");
void dgemv(int order, int trans, int m, int n, double alpha, const double* a, int lda,
           const double* x, int incx, double beta, double* y, int incy) __asm__("cblas_dgemv");
}

}  // namespace zest::host::blas

#endif
