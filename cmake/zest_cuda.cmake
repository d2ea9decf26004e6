# zest_cuda.cmake — the GPU side (issue 5): the CUDA language, cuBLAS and NCCL, as zest::cuda.
#
# Included by the top-level CMakeLists.txt when ZEST_CUDA is ON. Defines:
#   zest::cuda            INTERFACE target: zest::zest + CUDA::cudart + CUDA::cublas + NCCL
#   zest::cuda_kernels    zest::cuda + the kernels of zest/cuda_kernels.cu, built once, for
#                         programs whose host-compiled TUs drive them
#   ZEST_CUDA_READY       TRUE when the CUDA toolkit and NCCL were both found
# CMAKE_CUDA_ARCHITECTURES defaults to 90 (Hopper: H100, H200); override it, e.g. with
# -DCMAKE_CUDA_ARCHITECTURES=native on a machine with a GPU, or "80;90" for several.
# NCCL is looked for under the CUDA toolkit, then in the system paths (header nccl.h,
# library libnccl); ZEST_NCCL_INCLUDE_DIR and ZEST_NCCL_LIBRARY override.
include_guard(GLOBAL)

set(ZEST_CUDA_READY FALSE)

# nvcc's -O is the host compiler's level, and a second one after the build type's makes it
# warn of a redefinition: a folder whose GPU targets name their own level drops the build
# type's from its CUDA flags (directory variables over the cache's, which keeps the user's).
macro(zest_cuda_drop_build_type_level)
  foreach(zest_config DEBUG RELEASE RELWITHDEBINFO MINSIZEREL)
    string(REGEX REPLACE "(^| )-O[0-9sg]?( |$)" " " CMAKE_CUDA_FLAGS_${zest_config}
                         "${CMAKE_CUDA_FLAGS_${zest_config}}")
  endforeach()
endmacro()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures zest's GPU targets are built for")
endif()
if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER AND CMAKE_CXX_COMPILER)
  # nvcc's host compiler is the one the C++ targets use, so both see the same standard library.
  set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}" CACHE FILEPATH "Host compiler of nvcc")
endif()
enable_language(CUDA)
find_package(CUDAToolkit)

if(CUDAToolkit_FOUND)
  find_path(ZEST_NCCL_INCLUDE_DIR nccl.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} "${CUDAToolkit_LIBRARY_ROOT}/include"
    DOC "Directory holding nccl.h")
  find_library(ZEST_NCCL_LIBRARY nccl
    HINTS ${CUDAToolkit_LIBRARY_DIR} "${CUDAToolkit_LIBRARY_ROOT}/lib" "${CUDAToolkit_LIBRARY_ROOT}/lib64"
    DOC "NCCL library")
endif()

if(CUDAToolkit_FOUND AND TARGET CUDA::cublas AND ZEST_NCCL_INCLUDE_DIR AND ZEST_NCCL_LIBRARY)
  if(NOT TARGET zest::nccl)
    add_library(zest::nccl UNKNOWN IMPORTED)
    set_target_properties(zest::nccl PROPERTIES
      IMPORTED_LOCATION "${ZEST_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${ZEST_NCCL_INCLUDE_DIR}")
  endif()
  if(NOT TARGET zest_cuda)
    add_library(zest_cuda INTERFACE)
    add_library(zest::cuda ALIAS zest_cuda)
    target_link_libraries(zest_cuda INTERFACE zest::zest CUDA::cudart_static CUDA::cublas zest::nccl)
    # C++20 for nvcc by flag: CMake before 3.28 or so knows no CUDA20 dialect flag for nvcc 13,
    # so CUDA_STANDARD 20 / cuda_std_20 fail at generate time there.
    # --expt-relaxed-constexpr: the loop bodies that kernels run (ZEST_HOST_DEVICE) call
    # constexpr host functions: bfloat16/float16 conversions, splitmix64, std::min.
    target_compile_options(zest_cuda INTERFACE
      $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --expt-relaxed-constexpr>)
  endif()
  # zest::cuda_kernels: zest::cuda plus zest/cuda_kernels.cu compiled once (an object library
  # that each program linking it gets), so that translation units compiled by the host
  # compiler may drive the fixed kernels (zest/cuda_kernels.cu says which).
  if(NOT TARGET zest_cuda_kernels)
    add_library(zest_cuda_kernels OBJECT "${PROJECT_SOURCE_DIR}/include/zest/cuda_kernels.cu")
    add_library(zest::cuda_kernels ALIAS zest_cuda_kernels)
    target_link_libraries(zest_cuda_kernels PUBLIC zest::cuda)
    target_compile_definitions(zest_cuda_kernels INTERFACE ZEST_CUDA_PREBUILT_KERNELS)
    # Eigen's __host__ __device__ defaults (20012, 20013, 20015), unsigned compared with 0 (186).
    target_compile_options(zest_cuda_kernels PRIVATE -diag-suppress=186,20012,20013,20015)
  endif()
  set(ZEST_CUDA_READY TRUE)
  message(STATUS "zest: GPU targets for CUDA ${CUDAToolkit_VERSION}, architectures "
                 "${CMAKE_CUDA_ARCHITECTURES}, NCCL ${ZEST_NCCL_LIBRARY}")
else()
  message(STATUS "zest: ZEST_CUDA is ON but the CUDA toolkit, cuBLAS or NCCL is missing: "
                 "no GPU targets (NCCL: '${ZEST_NCCL_INCLUDE_DIR}', '${ZEST_NCCL_LIBRARY}')")
endif()
