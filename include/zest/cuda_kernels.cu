// zest/cuda_kernels.cu — the CUDA kernels built once per program, for translation units that
// a host compiler compiles.
//
// A kernel exists where nvcc compiles its launch, so a TU that computes on device tensors is
// normally a .cu file, and nvcc compiles the whole typed stack for it (two EDG front ends,
// then the host compiler). A TU that only drives the fixed kernels (redistribute's copies,
// sums and wire codec, einsum's permutes, reductions and cuBLAS calls, fills, the NCCL
// collectives) may instead be compiled by g++ or clang++ when the program has this file,
// compiled by nvcc, which instantiates those kernels once for the element types they serve:
//
//   fills and plain copies            per storage word: 1, 2, 4 and 8 bytes (any element type)
//   sums, conversions, reductions     float, double, bfloat16 (each pair)
//   the int8 wire's encode and decode   float, bfloat16, float16 (what a quantized wire carries)
//
// and the host-compiled TUs see ZEST_CUDA_PREBUILT_KERNELS. CMake: link zest::cuda_kernels
// (cmake/zest_cuda.cmake; an object library of this file). Anything else on the device
// (autodiff, optimizers, ZeRO's engine, MoE) stops a host-compiled TU with a static_assert
// that names the fix (zest/backend/cuda/cuda_backend.hpp, checked_for_each and the others,
// which hold the lists).
#include <vector>

#include "zest/cuda.hpp"

#if !ZEST_CUDA_COMPILER
#error "zest/cuda_kernels.cu instantiates CUDA kernels: compile it with nvcc"
#endif

namespace zest::cuda::detail {
namespace {

using erased_launcher = void (*)();
template <class F>
erased_launcher erase_launcher(F* f) {
  return reinterpret_cast<erased_launcher>(f);  // NOLINT: only stored, never called
}
template <class S, class... D>
void add_pairs(std::vector<erased_launcher>& t, type_list<D...> /*unused*/) {
  (t.push_back(erase_launcher(&launch_relayout<false, S, D>)), ...);
  (t.push_back(erase_launcher(&launch_relayout<true, S, D>)), ...);
  (t.push_back(erase_launcher(&launch_reduce<S, D>)), ...);
}
template <class... U, class... T, class... W>
std::vector<erased_launcher> prebuilt_launchers(type_list<U...> /*words*/,
                                                type_list<T...> /*numbers*/,
                                                type_list<W...> /*wire elements*/) {
  std::vector<erased_launcher> t;
  (t.push_back(erase_launcher(&launch_fill<U>)), ...);
  (t.push_back(erase_launcher(&launch_relayout<false, U, U>)), ...);
  (add_pairs<T>(t, type_list<T...>{}), ...);
  (t.push_back(erase_launcher(&launch_for_each<zest::detail::encode_blocks_fn<W>>)), ...);
  (t.push_back(erase_launcher(&launch_for_each<zest::detail::decode_fn<W>>)), ...);
  (t.push_back(erase_launcher(&launch_for_each<zest::detail::decode_sum_fn<W>>)), ...);
  return t;
}

}  // namespace

// Every launcher the lists name, by address: externally visible, so that nvcc emits each one
// for the program's other TUs to link and no optimiser drops them.
extern const std::vector<erased_launcher> prebuilt_kernel_table;
const std::vector<erased_launcher> prebuilt_kernel_table =
    prebuilt_launchers(prebuilt_words{}, prebuilt_numbers{}, prebuilt_wire_elements{});

}  // namespace zest::cuda::detail
