// bench/gpu_gemm.cu — einsum "ik,kj->ij" in bfloat16 through zest's typed API on a one-GPU
// cuda_mesh, against a direct cublasGemmEx call on the same buffers in the same run.
//
//   bench_gpu_gemm [--n 8192] [--reps 20] [--rounds 9] [--json FILE]
//
// Prints `METRIC <name> <value>` lines (bench/run's protocol) and, with --json, writes
// {"metrics": {...}} to FILE:
//   gpu_gemm_ratio_vs_cublas  cuBLAS time / einsum time (1 = no overhead; target >= 0.95)
//   gpu_gemm_tflops           2 n^3 / einsum time, in TFLOP/s (for the record)
//   gpu_gemm_control_ratio    cuBLAS time / cuBLAS time, the same call timed as a third
//                             series: the machine's spread (1 on a steady card)
// Both sides compute in float with bfloat16 inputs and output (CUBLAS_COMPUTE_32F). Timing:
// CUDA events around `reps` back-to-back calls on the compute stream, in `rounds` rounds
// after a warm-up, the series taking turns at going first; each series' median round.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "zest/cuda.hpp"

namespace {

using mesh_t = zest::cuda_mesh<"x">;
using a_t = zest::tensor<zest::bfloat16, mesh_t, "ik">;
using b_t = zest::tensor<zest::bfloat16, mesh_t, "kj">;

// Deterministic values in [-1, 1), as bfloat16 bits.
__global__ void fill_random(std::uint16_t* p, std::uint64_t n, std::uint32_t seed) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761U ^ seed;
    h ^= h >> 16U;
    h *= 0x85ebca6bU;
    h ^= h >> 13U;
    const float f = static_cast<float>(h & 0xffffU) / 32768.0F - 1.0F;
    p[i] = static_cast<std::uint16_t>(__float_as_uint(f) >> 16U);
  }
}

template <class X>
void randomise(X& x, std::uint32_t seed) {
  auto* p = reinterpret_cast<std::uint16_t*>(x.local().data());  // NOLINT: bfloat16 is 16 bits
  fill_random<<<1024, 256, 0, zest::cuda::compute_stream()>>>(p, x.local().size(), seed);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "bench_gpu_gemm: %s: %s\n", what, cublasGetStatusString(s));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);
  std::size_t n = 8192;
  int reps = 20, rounds = 9, warmup_rounds = 50;
  std::string json;
  int at = 0;  // the option being read, for the message of a value that is no number
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      at = i;
      const auto next = [&]() -> std::string {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "bench_gpu_gemm: %s needs a value\n", argv[i]);
          std::exit(2);
        }
        return argv[++i];
      };
      if (arg == "--n") n = std::stoul(next());
      else if (arg == "--reps") reps = std::stoi(next());
      else if (arg == "--rounds") rounds = std::stoi(next());
      else if (arg == "--json") json = next();
      else if (arg == "--quick") n = 4096, reps = 5, rounds = 3, warmup_rounds = 5;
      else {
        std::fprintf(
            stderr,
            "usage: bench_gpu_gemm [--n N] [--reps R] [--rounds K] [--json FILE] [--quick]\n");
        return 2;
      }
    }
  } catch (const std::logic_error&) {  // std::stoul, stoi, stod: not a number, or out of range
    std::fprintf(stderr, "bench_gpu_gemm: %s takes a number, not '%s'\n", argv[at],
                 at + 1 < argc ? argv[at + 1] : "");
    return 2;
  }
  if (n == 0 || reps < 1 || rounds < 1) {
    std::fprintf(stderr, "bench_gpu_gemm: --n, --reps and --rounds take positive numbers\n");
    return 2;
  }
  // No driver or no device: 77; a CUDA that fails to start otherwise throws.
  if (const auto seen = zest::cuda::visible_devices(); seen.count == 0) {
    std::fprintf(stderr, "bench_gpu_gemm: no usable GPU: %s\n", seen.why_none.c_str());
    return 77;
  }

  mesh_t m(MPI_COMM_WORLD, {1});
  a_t a(m, {n, n}, a_t::uninitialized);
  b_t b(m, {n, n}, b_t::uninitialized);
  randomise(a, 1);
  randomise(b, 2);
  zest::device_buffer<zest::bfloat16> direct_out(n * n);

  cublasHandle_t handle = nullptr;
  check_blas(cublasCreate(&handle), "cublasCreate");
  check_blas(cublasSetStream(handle, zest::cuda::compute_stream()), "cublasSetStream");
  const int ni = static_cast<int>(n);
  const float alpha = 1.0F, beta = 0.0F;
  // Row-major C = A B is column-major C^T = B^T A^T: B first, as cuBLAS sees it.
  const auto direct = [&] {
    check_blas(
        cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &alpha, b.local().data(),
                     CUDA_R_16BF, ni, a.local().data(), CUDA_R_16BF, ni, &beta, direct_out.data(),
                     CUDA_R_16BF, ni, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  };
  const auto through_zest = [&] {
    auto c = zest::einsum<"ik,kj->ij">(a, b);
    return c;
  };

  // Warm-up (heuristics, pool blocks), and the two results must agree.
  direct();
  const auto c0 = through_zest();
  zest::cuda::synchronize();
  {
    const auto got = c0.local_to_host();
    std::vector<zest::bfloat16> want(n * n);
    zest::cuda_backend::to_host<zest::bfloat16>(direct_out.span(), want.data());
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); i += 997) {
      worst = std::max(worst, std::abs(double(float(got[i])) - double(float(want[i]))));
    }
    if (worst > 1e-2 * std::sqrt(double(n))) {
      std::fprintf(stderr, "bench_gpu_gemm: einsum and cublasGemmEx disagree by %g\n", worst);
      return 1;
    }
  }

  zest::cuda::event start(true), stop(true);
  const auto time_ms = [&](auto&& run) {
    start.record(zest::cuda::compute_stream());
    for (int r = 0; r < reps; ++r) run();
    stop.record(zest::cuda::compute_stream());
    stop.synchronize();
    return double(stop.elapsed_ms(start)) / reps;
  };
  // A bf16 GEMM of this size draws the card to its power limit and its clock down within
  // a second (seen on an H200, 2026-12-04: cuBLAS first in every round, each side's best
  // round, read 0.913). So: half a second of warm-up at full load, then rounds in which the
  // three series (cuBLAS, einsum, cuBLAS again as a control) take turns at going first, and
  // each series' median round. The control's ratio is this machine's spread: a difference
  // smaller than it between einsum and cuBLAS is noise.
  double warmed_ms = 0;
  while (warmed_ms < 500 && warmup_rounds-- > 0) warmed_ms += time_ms(direct) * reps;
  const auto zest_call = [&] { (void)through_zest(); };
  std::vector<double> t_direct, t_zest, t_control;
  for (int round = 0; round < rounds; ++round) {
    for (int turn = 0; turn < 3; ++turn) {
      switch ((round + turn) % 3) {
        case 0: t_direct.push_back(time_ms(direct)); break;
        case 1: t_zest.push_back(time_ms(zest_call)); break;
        default: t_control.push_back(time_ms(direct)); break;
      }
    }
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  const double direct_ms = median(t_direct), zest_ms = median(t_zest);
  const double control_ms = median(t_control);
  const double flops = 2.0 * double(n) * double(n) * double(n);
  const double ratio = direct_ms / zest_ms;
  const double spread = direct_ms / control_ms;
  const double tflops = flops / (zest_ms * 1e-3) / 1e12;
  std::printf(
      "gpu gemm n=%zu bf16, medians of %d rounds of %d: einsum %.3f ms, cublasGemmEx %.3f ms "
      "(%.1f TFLOP/s), cublasGemmEx again %.3f ms\n",
      n, rounds, reps, zest_ms, direct_ms, flops / (direct_ms * 1e-3) / 1e12, control_ms);
  std::printf("METRIC gpu_gemm_ratio_vs_cublas %.4f\n", ratio);
  std::printf("METRIC gpu_gemm_tflops %.2f\n", tflops);
  std::printf("METRIC gpu_gemm_control_ratio %.4f\n", spread);
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"metrics\": {\"gpu_gemm_ratio_vs_cublas\": " << ratio
        << ", \"gpu_gemm_tflops\": " << tflops
        << ", \"cublas_gemm_tflops\": " << flops / (direct_ms * 1e-3) / 1e12
        << ", \"gpu_gemm_control_ratio\": " << spread << "}}\n";
    if (!out) {
      std::fprintf(stderr, "bench_gpu_gemm: cannot write %s\n", json.c_str());
      return 1;
    }
  }
  cublasDestroy(handle);
  return 0;
}
