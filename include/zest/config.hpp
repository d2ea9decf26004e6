// zest/config.hpp — the one place for portability switches.
//
// Everything that depends on the compiler or on optional dependencies is decided
// here, so that the rest of the library reads as plain C++20.
#pragma once

#include <cstddef>

// ZEST_CUDA_COMPILER: this translation unit is being compiled by nvcc (host or device pass).
#if defined(__CUDACC__)
#define ZEST_CUDA_COMPILER 1
#else
#define ZEST_CUDA_COMPILER 0
#endif

// ZEST_HOST_DEVICE: a function that device code may call too (the bodies of the element and
// row loops that every backend runs, zest/backend/backend.hpp). Plain C++ for host compilers.
// ZEST_DEVICE_PASS: this is nvcc's device pass (code that must use the device's math).
#if ZEST_CUDA_COMPILER
#define ZEST_HOST_DEVICE __host__ __device__
#else
#define ZEST_HOST_DEVICE
#endif
#if defined(__CUDA_ARCH__)
#define ZEST_DEVICE_PASS 1
#else
#define ZEST_DEVICE_PASS 0
#endif

// ZEST_HAS_BLAS: a CBLAS interface (OpenBLAS on Debian) is linked. The CMake target sets it
// when BLAS is found; local contractions then call cblas_?gemm, otherwise Eigen's GEMM.
#ifndef ZEST_HAS_BLAS
#define ZEST_HAS_BLAS 0
#endif

// ZEST_HAS_MPI: <mpi.h> is available. The MPI communicator and mesh constructors from an
// MPI communicator need it; the single-rank communicator does not.
#ifndef ZEST_HAS_MPI
#if defined(__has_include)
#if __has_include(<mpi.h>)
#define ZEST_HAS_MPI 1
#else
#define ZEST_HAS_MPI 0
#endif
#else
#define ZEST_HAS_MPI 0
#endif
#endif

// String literals as template arguments (`einsum<"ik,kj->ij">`, `mesh<"dp","tp">`) need
// class-type non-type template parameters (P0732). What is tested: g++ 12 and clang++ 19
// build and pass the whole suite (the `clang` preset); clang++ 14, Debian 12's default,
// builds and runs examples/einsum_tour in CI; nvcc 13 compiles the GPU targets. clang
// reports __cpp_nontype_template_args as 201411 even in 19 while implementing what zest
// uses, so clang is accepted by version; clang 13 and older have not been tried (define
// ZEST_STRING_TEMPLATE_ARGS=1 to try one anyway).
#ifndef ZEST_STRING_TEMPLATE_ARGS
#if defined(__clang__) && !ZEST_CUDA_COMPILER
#if __clang_major__ >= 14
#define ZEST_STRING_TEMPLATE_ARGS 1
#else
#define ZEST_STRING_TEMPLATE_ARGS 0
#endif
#elif defined(__cpp_nontype_template_args) && __cpp_nontype_template_args >= 201911L
#define ZEST_STRING_TEMPLATE_ARGS 1
#elif ZEST_CUDA_COMPILER
// nvcc's front end reports an older value while still accepting the feature.
#define ZEST_STRING_TEMPLATE_ARGS 1
#else
#define ZEST_STRING_TEMPLATE_ARGS 0
#endif
#endif
#if !ZEST_STRING_TEMPLATE_ARGS
#error \
    "zest needs C++20 class-type template arguments: g++ >= 12, clang++ >= 14 or nvcc >= 13 (see zest/config.hpp for what is tested)"
#endif

// consteval where the compiler supports it well, constexpr otherwise.
#if defined(__cpp_consteval) && !ZEST_CUDA_COMPILER
#define ZEST_CONSTEVAL consteval
#else
#define ZEST_CONSTEVAL constexpr
#endif

namespace zest {

// Upper bounds for compile-time descriptors. A tensor with more dims, or a mesh with more
// axes, is rejected with a static_assert that names these limits.
inline constexpr std::size_t max_dims = 12;
inline constexpr std::size_t max_axes = 6;
inline constexpr std::size_t max_operands = 4;

// The library's version (CMakeLists.txt's project version; CMake checks that they agree).
// Ranks built from different versions refuse to train together (zero_engine's start-up check).
inline constexpr const char* version = "0.1.0";

}  // namespace zest
