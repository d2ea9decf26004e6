// zest/backend/cuda/cuda_backend.hpp — shards in device memory, cuBLAS and small kernels.
//
//   using mesh_t = zest::cuda_mesh<"dp", "tp">;        // its communicator names cuda_backend
//   using x_t = zest::tensor<zest::bfloat16, mesh_t, "ik", zest::layout<zest::split<'i', "dp">>>;
//   auto y = zest::einsum<"ik,kj->ij">(x, w);          // a cuBLAS GEMM on each rank's shard
//
// The same static members as host_backend (zest/backend/backend.hpp), on device pointers:
//   buffer<T>      zest::device_buffer<T> from the caching pool (device_memory.hpp)
//   copy_slices    cudaMemcpy2DAsync, or a kernel for narrow rows
//   fill           cudaMemsetAsync for zero, a kernel otherwise
//   contract       the planner's permute + strided batched GEMM plan (contraction_plan.hpp),
//                  run as kernels and cublasGemmStridedBatchedEx: float (TF32 tensor cores
//                  when allowed, see settings()), double, and bfloat16 with float accumulation
//   from_host / to_host
// Everything runs on cuda::compute_stream(), asynchronously; to_host waits.
//
// Element semantics follow the host backend: bfloat16 contractions accumulate in float and
// round once at the end, so the two backends agree up to summation order.
//
// The kernels are compiled only by nvcc. A translation unit compiled by a host compiler
// may include this header (for the types), but a call that needs a kernel stops its
// compilation with a static_assert that says to compile it with nvcc.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>

#include "zest/backend/backend.hpp"
#include "zest/backend/contraction_plan.hpp"
#include "zest/backend/cuda/device_memory.hpp"
#include "zest/config.hpp"
#include "zest/core/bfloat16.hpp"
#include "zest/core/error.hpp"
#include "zest/core/float16.hpp"

namespace zest {

namespace cuda {

// Switches of the CUDA backend (process-wide).
struct backend_settings {
  // fp32 GEMMs on TF32 tensor cores (10-bit mantissa products, fp32 sums): several times
  // faster, results differ from the host's in the 4th significant digit. Off by default;
  // ZEST_CUDA_TF32=1 turns it on.
  bool allow_tf32 = false;
};
inline backend_settings& settings() {
  static backend_settings s = [] {
    backend_settings b;
    if (const char* on = std::getenv("ZEST_CUDA_TF32")) b.allow_tf32 = std::string_view(on) != "0";
    return b;
  }();
  return s;
}

inline void check(cublasStatus_t status, std::string_view call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw cuda_error(zest::detail::message("zest: ", call, ": ", cublasGetStatusString(status)));
}

// This thread's cuBLAS handle for the current device, bound to the compute stream. Never
// destroyed (see pool()): handles live as long as the process.
inline cublasHandle_t blas_handle() {
  thread_local std::unordered_map<int, cublasHandle_t> handles;
  const int device = current_device();
  auto it = handles.find(device);
  if (it == handles.end()) {
    cublasHandle_t h = nullptr;
    check(cublasCreate(&h), "cublasCreate");
    it = handles.emplace(device, h).first;
  }
  check(cublasSetStream(it->second, compute_stream()), "cublasSetStream");
  return it->second;
}

namespace detail {

// ---- descriptors: what the kernels get (plain data, by value) ----------------------------

// A walk over up to max_dims dims, outermost first, with element strides into a source and
// a destination; element i of the walk is the row-major index over `extent`.
struct walk_descriptor {
  int rank = 0;
  std::uint64_t extent[max_dims] = {};
  std::uint64_t src[max_dims] = {};
  std::uint64_t dst[max_dims] = {};
};

// An output walk (kept dims) and, per output element, a walk over the summed source dims.
struct reduce_descriptor {
  walk_descriptor kept;
  int reduced_rank = 0;
  std::uint64_t reduced_extent[max_dims] = {};
  std::uint64_t reduced_src[max_dims] = {};
};

// zest::bfloat16 as kernels see it: the same 16 bits, in a type with no host-only members.
// Layout-compatible with zest::bfloat16 and with CUDA's __nv_bfloat16.
struct bf16_bits {
  std::uint16_t bits;
};
static_assert(sizeof(bf16_bits) == sizeof(bfloat16) && alignof(bf16_bits) == alignof(bfloat16));

template <class T>
struct device_type {
  using type = T;
};
template <>
struct device_type<bfloat16> {
  using type = bf16_bits;
};
template <class T>
using device_t = typename device_type<T>::type;

template <class T>
auto* device_ptr(T* p) {
  return reinterpret_cast<device_t<T>*>(p);  // NOLINT: layout-compatible by the asserts above
}
template <class T>
const auto* device_ptr(const T* p) {
  return reinterpret_cast<const device_t<T>*>(p);  // NOLINT
}

// Unsigned integer of a given size, for fills of any element type.
template <std::size_t Bytes>
using bits_of_size = std::conditional_t<
    Bytes == 1, std::uint8_t,
    std::conditional_t<Bytes == 2, std::uint16_t,
                       std::conditional_t<Bytes == 4, std::uint32_t, std::uint64_t>>>;

template <class>
inline constexpr bool needs_nvcc = false;

inline unsigned blocks_for(std::uint64_t count, unsigned threads) {
  const std::uint64_t blocks = (count + threads - 1) / threads;
  return static_cast<unsigned>(std::min<std::uint64_t>(blocks, 1U << 20U));  // grid-stride beyond
}
inline constexpr unsigned threads_per_block = 256;

#if ZEST_CUDA_COMPILER

static_assert(sizeof(__nv_bfloat16) == sizeof(bfloat16), "zest: bfloat16 must match __nv_bfloat16");

// ---- element conversions on the device (the host's rules: bfloat16 rounds to nearest even)

template <class T>
struct compute_of {
  using type = T;
};
template <>
struct compute_of<bf16_bits> {
  using type = float;
};
template <>
struct compute_of<float> {
  using type = float;
};

__device__ inline float to_float(bf16_bits v) {
  return __uint_as_float(static_cast<unsigned>(v.bits) << 16U);
}
__device__ inline bf16_bits to_bf16(float f) {
  const unsigned u = __float_as_uint(f);
  if ((u & 0x7f800000U) == 0x7f800000U && (u & 0x007fffffU) != 0) {
    return bf16_bits{static_cast<std::uint16_t>((u >> 16U) | 0x0040U)};  // quiet NaN, as the host
  }
  const unsigned lsb = (u >> 16U) & 1U;
  return bf16_bits{static_cast<std::uint16_t>((u + 0x7fffU + lsb) >> 16U)};
}

// Converts between storage types through the wider compute type.
template <class To, class From>
__device__ inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, bf16_bits>) {
    return convert<To>(to_float(v));
  } else if constexpr (std::is_same_v<To, bf16_bits>) {
    return to_bf16(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

// ---- kernels -------------------------------------------------------------------------------

template <class U>
__global__ void fill_kernel(U* p, std::uint64_t n, U value) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    p[i] = value;
  }
}

// dst = src (or dst += src) along a walk; D and S may differ (bfloat16 <-> float).
template <bool Add, class S, class D>
__global__ void relayout_kernel(walk_descriptor w, const S* src, D* dst, std::uint64_t count) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    std::uint64_t rest = i, so = 0, dof = 0;
    for (int d = w.rank - 1; d >= 0; --d) {
      const std::uint64_t k = rest % w.extent[d];
      rest /= w.extent[d];
      so += k * w.src[d];
      dof += k * w.dst[d];
    }
    if constexpr (Add) {
      using C = typename compute_of<D>::type;
      dst[dof] = convert<D>(convert<C>(dst[dof]) + convert<C>(src[so]));
    } else {
      dst[dof] = convert<D>(src[so]);
    }
  }
}

// Each output element: the sum of the source over the reduced dims, in the compute type,
// rounded once (plus the old value when accumulating).
template <class S, class D>
__global__ void reduce_kernel(reduce_descriptor r, const S* src, D* dst, std::uint64_t count,
                              std::uint64_t reduced_count, bool accumulate) {
  using C =
      std::conditional_t<std::is_same_v<S, double> || std::is_same_v<D, double>, double, float>;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    std::uint64_t rest = i, base = 0, dof = 0;
    for (int d = r.kept.rank - 1; d >= 0; --d) {
      const std::uint64_t k = rest % r.kept.extent[d];
      rest /= r.kept.extent[d];
      base += k * r.kept.src[d];
      dof += k * r.kept.dst[d];
    }
    C sum = 0;
    for (std::uint64_t j = 0; j < reduced_count; ++j) {
      std::uint64_t rj = j, so = base;
      for (int d = r.reduced_rank - 1; d >= 0; --d) {
        const std::uint64_t k = rj % r.reduced_extent[d];
        rj /= r.reduced_extent[d];
        so += k * r.reduced_src[d];
      }
      sum += convert<C>(src[so]);
    }
    dst[dof] = convert<D>(accumulate ? convert<C>(dst[dof]) + sum : sum);
  }
}

// f(i) for each i < n: the loop bodies of the generic code paths (backend.hpp's for_each).
template <class F>
__global__ void grid_for_each(std::uint64_t n, F f) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    f(static_cast<std::size_t>(i));
  }
}

// Each block's sum of f(i) over its grid-stride share, in double, to partial[block]; then
// one block adds the partials. The grid has a fixed size for a given n, so the order of the
// additions, and the result, are the same from run to run. (Not Thrust: its reduction
// kernels name ::cuda::std types, which a user's `using namespace zest;` makes ambiguous
// with zest::cuda in nvcc's generated host stubs.)
template <class F>
__global__ void grid_sum(std::uint64_t n, F f, double* partial) {
  __shared__ double cache[threads_per_block];
  double s = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    s += static_cast<double>(f(static_cast<std::size_t>(i)));
  }
  cache[threadIdx.x] = s;
  __syncthreads();
  for (unsigned stride = threads_per_block / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) cache[threadIdx.x] += cache[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = cache[0];
}
struct partial_sum {
  const double* p;
  __host__ __device__ double operator()(std::size_t i) const { return p[i]; }
};

template <class F>
void launch_for_each(std::size_t n, const F& f) {
  if (n == 0) return;
  grid_for_each<F>
      <<<blocks_for(n, threads_per_block), threads_per_block, 0, compute_stream()>>>(n, f);
  ZEST_CUDA_CHECK(cudaGetLastError());
}
template <class F>
double launch_sum(std::size_t n, const F& f) {
  if (n == 0) return 0.0;
  constexpr unsigned max_blocks = threads_per_block;  // the second pass is one block
  const unsigned blocks = std::min(blocks_for(n, threads_per_block), max_blocks);
  workspace<double> partial(blocks), total(1);
  grid_sum<F><<<blocks, threads_per_block, 0, compute_stream()>>>(n, f, partial.data());
  ZEST_CUDA_CHECK(cudaGetLastError());
  grid_sum<partial_sum><<<1, threads_per_block, 0, compute_stream()>>>(
      blocks, partial_sum{partial.data()}, total.data());
  ZEST_CUDA_CHECK(cudaGetLastError());
  double result = 0;
  copy_to_host(total.data(), 1, &result);  // waits for the stream
  return result;
}

template <class U>
void launch_fill(U* p, std::uint64_t n, U value) {
  if (n == 0) return;
  fill_kernel<U>
      <<<blocks_for(n, threads_per_block), threads_per_block, 0, compute_stream()>>>(p, n, value);
  ZEST_CUDA_CHECK(cudaGetLastError());
}
template <bool Add, class S, class D>
void launch_relayout(const walk_descriptor& w, const S* src, D* dst) {
  std::uint64_t count = 1;
  for (int d = 0; d < w.rank; ++d) count *= w.extent[d];
  if (count == 0) return;
  relayout_kernel<Add, device_t<S>, device_t<D>>
      <<<blocks_for(count, threads_per_block), threads_per_block, 0, compute_stream()>>>(
          w, device_ptr(src), device_ptr(dst), count);
  ZEST_CUDA_CHECK(cudaGetLastError());
}
template <class S, class D>
void launch_reduce(const reduce_descriptor& r, const S* src, D* dst, bool accumulate) {
  std::uint64_t count = 1, reduced = 1;
  for (int d = 0; d < r.kept.rank; ++d) count *= r.kept.extent[d];
  for (int d = 0; d < r.reduced_rank; ++d) reduced *= r.reduced_extent[d];
  if (count == 0) return;
  reduce_kernel<device_t<S>, device_t<D>>
      <<<blocks_for(count, threads_per_block), threads_per_block, 0, compute_stream()>>>(
          r, device_ptr(src), device_ptr(dst), count, reduced, accumulate);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

#else  // a host compiler: the launchers are declared; nvcc's TUs define them

template <class F>
void launch_for_each(std::size_t n, const F& f);
template <class F>
double launch_sum(std::size_t n, const F& f);
template <class U>
void launch_fill(U* p, std::uint64_t n, U value);
template <bool Add, class S, class D>
void launch_relayout(const walk_descriptor& w, const S* src, D* dst);
template <class S, class D>
void launch_reduce(const reduce_descriptor& r, const S* src, D* dst, bool accumulate);

#endif

// ---- which launches a TU that no nvcc compiles may make -----------------------------------
//
// A kernel exists where nvcc compiles its launch. A TU compiled by a host compiler (g++,
// clang++) may launch the kernels that zest/cuda_kernels.cu instantiates once per program
// (CMake: zest::cuda_kernels, which also defines ZEST_CUDA_PREBUILT_KERNELS); any other
// launch stops its compilation with a static_assert that names the fix. These lists are the
// ones that file instantiates: storage words for fills and plain copies, the floating types
// for sums, conversions and reductions, and the loops marked prebuilt_loop.
template <class... T>
struct type_list {};
using prebuilt_words = type_list<std::uint8_t, std::uint16_t, std::uint32_t, std::uint64_t>;
using prebuilt_numbers = type_list<float, double, bfloat16>;
// The element types a quantized wire carries (tensor/transition_group.hpp, wire_quantizable_v).
using prebuilt_wire_elements = type_list<float, bfloat16, float16>;
template <class T, class List>
inline constexpr bool listed = false;
template <class T, class... L>
inline constexpr bool listed<T, type_list<L...>> = (std::is_same_v<T, L> || ...);

// A loop body (a function object run by for_each) whose kernel is prebuilt: one that names
// its element type as `prebuilt_element`, which only the loop bodies that zest/cuda_kernels.cu
// instantiates do (tensor/wire_codec.hpp's encode and decode), for the wire's element types.
template <class F>
inline constexpr bool prebuilt_loop = false;
template <class F>
requires requires { typename F::prebuilt_element; }
inline constexpr bool prebuilt_loop<F> =
    listed<typename F::prebuilt_element, prebuilt_wire_elements>;

#if ZEST_CUDA_COMPILER || defined(ZEST_CUDA_PREBUILT_KERNELS)
inline constexpr bool prebuilt_kernels_linked = true;
#else
inline constexpr bool prebuilt_kernels_linked = false;
#endif
// A conversion, sum or reduction from S to D: prebuilt for each pair of the floating types.
template <class S, class D>
inline constexpr bool prebuilt_pair =
    prebuilt_kernels_linked&& listed<S, prebuilt_numbers>&& listed<D, prebuilt_numbers>;
// The fix every refusal below names.
#define ZEST_CUDA_KERNEL_FIX                                                                \
  " Fix: compile this translation unit with nvcc (a .cu file, or LANGUAGE CUDA in CMake), " \
  "or link zest::cuda_kernels (zest/cuda_kernels.cu) and define ZEST_CUDA_PREBUILT_KERNELS."

// What the backend calls: the launcher, checked where no nvcc compiles the TU.
template <class F>
void checked_for_each(std::size_t n, const F& f) {
  if constexpr (!ZEST_CUDA_COMPILER) {
    static_assert(prebuilt_kernels_linked && prebuilt_loop<F>,
                  "zest cuda_backend: element and row loops on device tensors (autodiff "
                  "operations, optimizer steps, ZeRO packing, MoE routing) run CUDA kernels. "
                  "Fix: compile this translation unit with nvcc (a .cu file, or LANGUAGE CUDA "
                  "in CMake); a host compiler may only drive the prebuilt kernels "
                  "(zest/cuda_kernels.cu: redistribute, einsum, collectives).");
  }
  launch_for_each(n, f);
}
template <class F>
double checked_sum(std::size_t n, const F& f) {
  static_assert(ZEST_CUDA_COMPILER || needs_nvcc<F>,
                "zest cuda_backend: sums over device tensors (losses, norms, overflow checks) "
                "run CUDA kernels. Fix: compile this translation unit with nvcc (a .cu file, or "
                "LANGUAGE CUDA in CMake).");
  return launch_sum(n, f);
}
template <class U>
void checked_fill(U* p, std::uint64_t n, U value) {
  if constexpr (!ZEST_CUDA_COMPILER) {
    static_assert(prebuilt_kernels_linked && listed<U, prebuilt_words>,
                  "zest cuda_backend: filling device memory with a non-zero value runs a CUDA "
                  "kernel." ZEST_CUDA_KERNEL_FIX);
  }
  launch_fill<U>(p, n, value);
}
// A plain copy (no sum, the same type) moves storage words: one kernel per element size.
template <bool Add, class S, class D>
void checked_relayout(const walk_descriptor& w, const S* src, D* dst) {
  if constexpr (!Add && std::is_same_v<S, D>) {
    using U = bits_of_size<sizeof(S)>;
    static_assert(sizeof(U) == sizeof(S), "zest cuda_backend: elements of 1, 2, 4 or 8 bytes");
    if constexpr (!ZEST_CUDA_COMPILER) {
      static_assert(
          prebuilt_kernels_linked || needs_nvcc<S>,  // dependent: checked when used
          "zest cuda_backend: copies of device tensors run CUDA kernels." ZEST_CUDA_KERNEL_FIX);
    }
    launch_relayout<false>(w, reinterpret_cast<const U*>(src),  // NOLINT: same size
                           reinterpret_cast<U*>(dst));          // NOLINT
  } else {
    if constexpr (!ZEST_CUDA_COMPILER) {
      static_assert(prebuilt_pair<S, D>,
                    "zest cuda_backend: permutes, narrow copies and contractions of device "
                    "tensors run CUDA kernels." ZEST_CUDA_KERNEL_FIX);
    }
    launch_relayout<Add>(w, src, dst);
  }
}
template <class S, class D>
void checked_reduce(const reduce_descriptor& r, const S* src, D* dst, bool accumulate) {
  if constexpr (!ZEST_CUDA_COMPILER) {
    static_assert(
        prebuilt_pair<S, D>,
        "zest cuda_backend: reductions of device tensors run CUDA kernels." ZEST_CUDA_KERNEL_FIX);
  }
  launch_reduce(r, src, dst, accumulate);
}

// ---- the contraction: the planner's plan (zest/backend/contraction_plan.hpp), on the device -

using contraction::dense_layout;
using contraction::dense_layout_like;
using contraction::gemm_plan;
using contraction::labels_in_order;
using contraction::tensor_layout;

// dst (layout `to`) = src (layout `from`, the same labels), or += with Add.
template <bool Add, class S, class D>
void relayout(const tensor_layout& from, const S* src, const tensor_layout& to, D* dst) {
  walk_descriptor w;
  for (std::size_t d = 0; d < to.rank; ++d) {
    w.extent[w.rank] = to.extent[d];
    w.src[w.rank] = from.stride_of(to.label[d]);
    w.dst[w.rank] = to.stride[d];
    ++w.rank;
  }
  checked_relayout<Add>(w, src, dst);
}

// dst (layout `to`) = sum of src over its dims missing in `to` (+ dst when accumulating).
template <class S, class D>
void reduce(const tensor_layout& from, const S* src, const tensor_layout& to, D* dst,
            bool accumulate) {
  reduce_descriptor r;
  for (std::size_t d = 0; d < to.rank; ++d) {
    r.kept.extent[r.kept.rank] = to.extent[d];
    r.kept.src[r.kept.rank] = from.stride_of(to.label[d]);
    r.kept.dst[r.kept.rank] = to.stride[d];
    ++r.kept.rank;
  }
  for (std::size_t d = 0; d < from.rank; ++d) {
    if (to.has(from.label[d])) continue;
    r.reduced_extent[r.reduced_rank] = from.extent[d];
    r.reduced_src[r.reduced_rank] = from.stride[d];
    ++r.reduced_rank;
  }
  checked_reduce(r, src, dst, accumulate);
}

template <class T>
constexpr cudaDataType_t blas_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, double>) return CUDA_R_64F;
  else return CUDA_R_16BF;
}

inline int blas_int(std::size_t v, std::string_view what) {
  if (v > static_cast<std::size_t>(INT_MAX)) {
    throw shape_error(zest::detail::message("zest: cuda contract: ", what, " = ", v,
                                            " exceeds INT_MAX, the largest cuBLAS takes"));
  }
  return static_cast<int>(v);
}

// The plan's GEMMs (row-major, as the host's run_plan calls them) on cuBLAS, which is
// column-major: C (m x n, row-major) = A B is C^T (n x m, column-major) = B^T A^T, so the
// operands swap and each row-major matrix is passed as its column-major transpose.
// A and B are S; C is S, or float for a bfloat16 product that a permute will round later.
template <class S, class C>
void run_gemms(const gemm_plan& plan, const S* x, const S* y, C* z, bool accumulate) {
  const S* a = plan.swap ? y : x;
  const S* b = plan.swap ? x : y;
  const int m = blas_int(plan.m, "m"), n = blas_int(plan.n, "n"), k = blas_int(plan.k, "k");
  // Leading dimensions in column-major terms; one that only spans a single column may be
  // anything, but cuBLAS still wants it at least the row count.
  const cublasOperation_t op_b = plan.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // B^T: n x k
  const cublasOperation_t op_a = plan.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // A^T: k x m
  const std::size_t b_rows = plan.trans_b ? plan.k : plan.n,
                    b_cols = plan.trans_b ? plan.n : plan.k;
  const std::size_t a_rows = plan.trans_a ? plan.m : plan.k,
                    a_cols = plan.trans_a ? plan.k : plan.m;
  const auto fix_ld = [](std::size_t ld, std::size_t rows, std::size_t cols) {
    return cols <= 1 ? std::max({ld, rows, std::size_t{1}}) : std::max(ld, std::size_t{1});
  };
  const int ldb = blas_int(fix_ld(plan.ldb, b_rows, b_cols), "ldb");
  const int lda = blas_int(fix_ld(plan.lda, a_rows, a_cols), "lda");
  const int ldc = blas_int(fix_ld(plan.ldc, plan.n, plan.m), "ldc");

  constexpr bool is_double = std::is_same_v<S, double>;
  using scalar = std::conditional_t<is_double, double, float>;
  const scalar alpha = 1;
  const scalar beta = accumulate ? 1 : 0;
  cublasComputeType_t compute = is_double ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  if (std::is_same_v<S, float> && settings().allow_tf32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  cublasHandle_t handle = blas_handle();

  const auto call = [&](std::size_t oa, std::size_t ob, std::size_t oc, std::size_t batch,
                        std::size_t sa, std::size_t sb, std::size_t sc) {
    if (batch == 1) {  // the plain GEMM: the same call (and kernel choice) as a direct cublasGemmEx
      check(cublasGemmEx(handle, op_b, op_a, n, m, k, &alpha, b + ob, blas_type<S>(), ldb, a + oa,
                         blas_type<S>(), lda, &beta, z + oc, blas_type<C>(), ldc, compute,
                         CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
      return;
    }
    check(cublasGemmStridedBatchedEx(handle, op_b, op_a, n, m, k, &alpha, b + ob, blas_type<S>(),
                                     ldb, static_cast<long long>(sb), a + oa, blas_type<S>(), lda,
                                     static_cast<long long>(sa), &beta, z + oc, blas_type<C>(), ldc,
                                     static_cast<long long>(sc), blas_int(batch, "batch count"),
                                     compute, CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx");
  };
  const auto& l = plan.loops;
  if (l.rank == 0) {
    call(0, 0, 0, 1, 0, 0, 0);
    return;
  }
  // The innermost loop is the batch; the others an odometer of calls (as on the host).
  const std::size_t last = l.rank - 1;
  std::array<std::size_t, max_dims> index{};
  std::size_t oa = 0, ob = 0, oc = 0;
  for (;;) {
    call(oa, ob, oc, l.extent[last], l.a[last], l.b[last], l.c[last]);
    std::size_t d = last;
    for (;;) {
      if (d == 0) return;
      --d;
      oa += l.a[d];
      ob += l.b[d];
      oc += l.c[d];
      if (++index[d] < l.extent[d]) break;
      oa -= l.a[d] * l.extent[d];
      ob -= l.b[d] * l.extent[d];
      oc -= l.c[d] * l.extent[d];
      index[d] = 0;
    }
  }
}

// Which tensors to permute, and the GEMM plan on the result: the planner's search.
using contraction::choose_pair_plan;
using contraction::pair_choice;

// Two operands, checks done, no zero extents. S is float or double, or bfloat16 when no
// dim is summed out of one operand alone (contract() converts that case to float).
template <class S>
void contract_pair(tensor_layout x, const S* xd, tensor_layout y, const S* yd,
                   const tensor_layout& z, S* out, bool accumulate) {
  // Dims in one operand only and not in the output are summed out of it first.
  workspace<S> reduced_x(0), reduced_y(0);
  const auto sum_only_dims = [&z](tensor_layout& t, const S*& data, const tensor_layout& other,
                                  workspace<S>& buffer) {
    const std::string kept = labels_in_order(t, [&](char l) { return z.has(l) || other.has(l); });
    if (kept.size() == t.rank) return;
    const tensor_layout r = dense_layout_like(kept, t);
    buffer = workspace<S>(r.size());
    reduce(t, data, r, buffer.data(), false);
    t = r;
    data = buffer.data();
  };
  sum_only_dims(x, xd, y, reduced_x);
  sum_only_dims(y, yd, x, reduced_y);

  const pair_choice best = choose_pair_plan(x, y, z);
  workspace<S> xp(best.px ? x.size() : 0), yp(best.py ? y.size() : 0);
  if (best.px) {
    relayout<false>(x, xd, best.x, xp.data());
    xd = xp.data();
  }
  if (best.py) {
    relayout<false>(y, yd, best.y, yp.data());
    yd = yp.data();
  }
  if (!best.pz) {
    run_gemms<S, S>(best.plan, xd, yd, out, accumulate);
    return;
  }
  // The product in a permuted layout, then moved (or added) into out. For bfloat16 it stays
  // in float until then, so the result is rounded once, as on the host.
  using Z = std::conditional_t<std::is_same_v<S, bfloat16>, float, S>;
  workspace<Z> zp(z.size());
  run_gemms<S, Z>(best.plan, xd, yd, zp.data(), false);
  if (accumulate) {
    relayout<true>(best.z, zp.data(), z, out);
  } else {
    relayout<false>(best.z, zp.data(), z, out);
  }
}

// One operand: a permute, or a reduction when some dims are not in the output.
template <class S>
void contract_single(const tensor_layout& x, const S* xd, const tensor_layout& z, S* out,
                     bool accumulate) {
  bool reduces = false;
  for (std::size_t d = 0; d < x.rank; ++d) reduces = reduces || !z.has(x.label[d]);
  if (reduces) {
    reduce(x, xd, z, out, accumulate);
  } else if (accumulate) {
    relayout<true>(x, xd, z, out);
  } else {
    relayout<false>(x, xd, z, out);
  }
}

template <class T>
void fill_device(T* p, std::size_t n, T value) {
  if (n == 0) return;
  using U = bits_of_size<sizeof(T)>;
  static_assert(sizeof(U) == sizeof(T),
                "zest cuda_backend: fill supports elements of 1, 2, 4 or 8 bytes");
  U bits{};
  std::memcpy(&bits, &value, sizeof(T));
  if (bits == 0) {
    ZEST_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(T), compute_stream()));
    return;
  }
  checked_fill<U>(reinterpret_cast<U*>(p), n, bits);  // NOLINT: same size, trivially copyable
}

}  // namespace detail

// out = einsum(operands -> out_labels) on device pointers, or out += it with accumulate: the
// semantics and checks of zest::host::contract (shape_error names the spec and the dim).
// Asynchronous on compute_stream().
template <class T>
void contract(std::span<const contraction::operand_view<T>> operands, std::string_view out_labels,
              T* out, std::span<const std::size_t> out_extents, bool accumulate = false) {
  static_assert(
      std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bfloat16>,
      "zest::cuda::contract: element type must be float, double or zest::bfloat16");
  using contraction::element_count;
  contraction::check_contract(operands, out_labels, out_extents);
  const std::size_t out_count = element_count(out_extents);
  if (out_count == 0) return;
  for (const auto& op : operands) {
    if (element_count(op.extents) == 0) {
      if (!accumulate) detail::fill_device(out, out_count, T(0.0F));
      return;
    }
  }
  using contraction::dense_layout;
  using contraction::tensor_layout;
  const tensor_layout z = dense_layout(out_labels, out_extents);
  const tensor_layout x = dense_layout(operands[0].labels, operands[0].extents);
  if (operands.size() == 1) {
    detail::contract_single<T>(x, operands[0].data, z, out, accumulate);
    return;
  }
  const tensor_layout y = dense_layout(operands[1].labels, operands[1].extents);
  bool summed_alone = false;
  for (std::size_t d = 0; d < x.rank; ++d)
    summed_alone = summed_alone || (!y.has(x.label[d]) && !z.has(x.label[d]));
  for (std::size_t d = 0; d < y.rank; ++d)
    summed_alone = summed_alone || (!x.has(y.label[d]) && !z.has(y.label[d]));
  if (!std::is_same_v<T, bfloat16> || !summed_alone) {
    detail::contract_pair<T>(x, operands[0].data, y, operands[1].data, z, out, accumulate);
    return;
  }
  // bfloat16 with a dim summed out of one operand: sum and multiply in float, like the host,
  // rather than rounding the partial sums to bfloat16 before the GEMM.
  workspace<float> xf(x.size()), yf(y.size()), zf(z.size());
  detail::relayout<false>(x, operands[0].data, x, xf.data());
  detail::relayout<false>(y, operands[1].data, y, yf.data());
  if (accumulate) detail::relayout<false>(z, out, z, zf.data());
  detail::contract_pair<float>(x, xf.data(), y, yf.data(), z, zf.data(), accumulate);
  detail::relayout<false>(z, zf.data(), z, out);
}

// Braced-list convenience, as zest::host::contract.
template <class T>
void contract(std::initializer_list<contraction::operand_view<T>> operands,
              std::string_view out_labels, T* out, std::span<const std::size_t> out_extents,
              bool accumulate = false) {
  // Qualified, so that no other contract (zest::host's, for a caller that has it) is a candidate.
  using view = contraction::operand_view<T>;
  cuda::contract<T>(std::span<const view>(operands.begin(), operands.size()), out_labels, out,
                    out_extents, accumulate);
}

}  // namespace cuda

// The CUDA backend: see the top of this file.
struct cuda_backend {
  static constexpr std::string_view name = "cuda";
  template <class T>
  using buffer = device_buffer<T>;

  // The data seen as [outer][D][inner]: `len` slices starting at src_off in a source with
  // D = src_d go to dst_off.. in a destination with D = dst_d (device pointers).
  template <class T>
  static void copy_slices(const T* src, std::size_t outer, std::size_t src_d, std::size_t src_off,
                          T* dst, std::size_t dst_d, std::size_t dst_off, std::size_t len,
                          std::size_t inner) {
    const std::size_t run = len * inner;
    if (run == 0 || outer == 0) return;
    const cudaStream_t s = cuda::compute_stream();
    const T* from = src + src_off * inner;
    T* to = dst + dst_off * inner;
    if (outer == 1 || (src_d == len && dst_d == len)) {  // one contiguous run
      ZEST_CUDA_CHECK(
          cudaMemcpyAsync(to, from, outer * run * sizeof(T), cudaMemcpyDeviceToDevice, s));
      return;
    }
    const std::size_t width = run * sizeof(T), spitch = src_d * inner * sizeof(T),
                      dpitch = dst_d * inner * sizeof(T);
    // Rows of at least 128 bytes go through the copy engine's 2-D copy; narrower ones (and
    // pitches beyond what cudaMemcpy2D takes) through a kernel, one thread per element.
    constexpr std::size_t max_pitch = std::size_t{1} << 30U;
    if (width >= 128 && spitch < max_pitch && dpitch < max_pitch) {
      ZEST_CUDA_CHECK(
          cudaMemcpy2DAsync(to, dpitch, from, spitch, width, outer, cudaMemcpyDeviceToDevice, s));
      return;
    }
    cuda::detail::walk_descriptor w;
    w.rank = 2;
    w.extent[0] = outer;
    w.extent[1] = run;
    w.src[0] = src_d * inner;
    w.src[1] = 1;
    w.dst[0] = dst_d * inner;
    w.dst[1] = 1;
    cuda::detail::checked_relayout<false>(w, from, to);
  }

  template <class T>
  static void fill(T* p, std::size_t n, T value) {
    cuda::detail::fill_device(p, n, value);
  }

  template <class T>
  static void contract(std::span<const contraction::operand_view<T>> operands,
                       std::string_view out_labels, T* out,
                       std::span<const std::size_t> out_extents) {
    cuda::contract<T>(operands, out_labels, out, out_extents);
  }

  // f(i) for each i < n in a kernel on the compute stream (f: ZEST_HOST_DEVICE call operator).
  template <class F>
  static void for_each(std::size_t n, const F& f) {
    cuda::detail::checked_for_each(n, f);
  }
  // The sum of f(i) over i < n, in double; waits for the compute stream's work so far.
  template <class F>
  static double sum(std::size_t n, const F& f) {
    return cuda::detail::checked_sum(n, f);
  }
  static memory::counters& counters() { return memory::device_counters(); }
  // Waits for the compute stream (kernels, copies, GEMMs; collectives order themselves on it).
  static void synchronize() { cuda::synchronize(); }

  template <class T>
  static buffer<T> from_host(std::span<const T> values) {
    buffer<T> b(values.size());
    cuda::copy_to_device(values, b.data());
    return b;
  }
  template <class T>
  static void to_host(std::span<const T> values, T* out) {
    cuda::copy_to_host(values.data(), values.size(), out);
  }
};

static_assert(backend<cuda_backend>);

}  // namespace zest
