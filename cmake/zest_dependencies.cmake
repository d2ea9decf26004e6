# zest_dependencies.cmake — how zest finds MPI and OpenBLAS.
#
# Used twice: by zest's own CMakeLists.txt and, installed next to it, by zestConfig.cmake,
# so that a consumer of an installed zest finds the same MPI and BLAS as zest's own build.
include_guard(GLOBAL)

# MPICH, consistently. On Debian, `mpicxx` and `mpiexec` are alternatives that an OpenMPI
# installed beside MPICH (a dependency of some other package) can take over; compiling with
# one MPI and launching with the other gives processes that each think they are rank 0 of 1.
# The .mpich names never move, so prefer them when they exist. A user who sets
# MPI_CXX_COMPILER or MPIEXEC_EXECUTABLE chooses for themselves.
macro(zest_prefer_mpich)
  if(NOT DEFINED MPI_CXX_COMPILER AND EXISTS /usr/bin/mpicxx.mpich)
    set(MPI_CXX_COMPILER /usr/bin/mpicxx.mpich
        CACHE FILEPATH "MPI C++ compiler wrapper (zest prefers MPICH's)")
  endif()
  if(NOT DEFINED MPIEXEC_EXECUTABLE AND EXISTS /usr/bin/mpiexec.mpich)
    set(MPIEXEC_EXECUTABLE /usr/bin/mpiexec.mpich
        CACHE FILEPATH "MPI launcher (zest prefers MPICH's)")
  endif()
  # The MPI-2 C++ bindings are deprecated and unused by zest: do not link them.
  if(NOT DEFINED MPI_CXX_SKIP_MPICXX)
    set(MPI_CXX_SKIP_MPICXX ON CACHE BOOL "Skip the deprecated MPI C++ bindings")
  endif()
endmacro()

# zest_find_openblas(<found-var>): defines the imported target zest::openblas (cblas.h and
# libopenblas) when OpenBLAS is installed, and sets <found-var> to TRUE or FALSE.
# OpenBLAS rather than "any BLAS": the reference BLAS is slower than Eigen's own GEMM, and
# only OpenBLAS's cblas.h comes with openblas_config.h, which tells the two apart.
# Debian puts both behind alternatives in /usr/include/<multiarch> and /usr/lib/<multiarch>;
# other systems use an openblas/ subdirectory.
function(zest_find_openblas found_var)
  if(TARGET zest::openblas)
    set(${found_var} TRUE PARENT_SCOPE)
    return()
  endif()
  # First the plain locations (on Debian, the alternatives that the admin chose), then
  # the subdirectories of particular builds. A second find_* runs only if the first failed.
  find_path(ZEST_OPENBLAS_INCLUDE_DIR NAMES openblas_config.h
    DOC "Directory holding OpenBLAS's cblas.h and openblas_config.h")
  find_path(ZEST_OPENBLAS_INCLUDE_DIR NAMES openblas_config.h
    PATH_SUFFIXES openblas openblas-pthread openblas-openmp openblas-serial)
  find_library(ZEST_OPENBLAS_LIBRARY NAMES openblas DOC "OpenBLAS library")
  find_library(ZEST_OPENBLAS_LIBRARY NAMES openblas
    PATH_SUFFIXES openblas-pthread openblas-openmp openblas-serial)
  if(ZEST_OPENBLAS_INCLUDE_DIR AND ZEST_OPENBLAS_LIBRARY
     AND EXISTS "${ZEST_OPENBLAS_INCLUDE_DIR}/cblas.h")
    add_library(zest::openblas UNKNOWN IMPORTED)
    set_target_properties(zest::openblas PROPERTIES
      IMPORTED_LOCATION "${ZEST_OPENBLAS_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${ZEST_OPENBLAS_INCLUDE_DIR}")
    set(${found_var} TRUE PARENT_SCOPE)
  else()
    set(${found_var} FALSE PARENT_SCOPE)
  endif()
endfunction()
