# zest_testing.cmake — zest_add_test() and the pieces every test shares.
#
#   zest_add_test(<name> SOURCES <files...>
#                 [MPI] [NPROCS <n...>] [LABELS <labels...>] [SUITES <suites...>] [UNITY]
#                 [LINK_LIBRARIES <targets...>] [ARGS <args...>] [TIMEOUT <seconds>])
#
# A plain test is one doctest executable, registered as the CTest test <name>; its main()
# is tests/support/doctest_main.cpp. An MPI test's main() is tests/support/mpi_main.cpp
# (doctest on every rank, checked mode on, exit code = max over ranks); it is registered
# once per process count, as <name>_np<N> (N in NPROCS, default 1 2 4), labelled `mpi`; a
# build without MPI (ZEST_WITH_MPI=OFF) skips it.
# SUITES: the executable holds several tests that share one translation unit (and so
# compile their common instantiations once), each a doctest suite (`* doctest::test_suite
# ("<suite>")` on its cases). Every suite is registered as a test of its own, named after
# the suite instead of <name> (<suite>, or <suite>_np<N>), which runs that suite's cases
# only (--test-suite=<suite>); the target is still zest_test_<name>. A source file names
# its suite with TEST_SUITE_BEGIN("<suite>"); ... TEST_SUITE_END(); around its cases.
# UNITY: the SOURCES are compiled as one translation unit (CMake's unity build), so that
# the tests of several files share that TU's instantiations; with SUITES, each file's
# tests stay tests of their own.
# Sources include shared helpers relative to tests/: "support/mpi_test.hpp".
#
#   zest_add_test(host_contract SOURCES contract_test.cpp)
#   zest_add_test(collectives SOURCES collectives_test.cpp MPI)            # np1, np2, np4
#   zest_add_test(mesh_2x2 SOURCES mesh_test.cpp MPI NPROCS 4 LABELS mesh)
include_guard(GLOBAL)

include(zest_warnings)

set(ZEST_TEST_TIMEOUT 300 CACHE STRING "Default CTest timeout of a zest test, in seconds")
option(ZEST_TEST_PRECOMPILED_HEADER
       "Compile the tests with zest/zest.hpp and doctest precompiled once (each test TU otherwise parses them anew, about 3 CPU s)"
       ON)
# The optimisation level of the test programs (zest_add_test's, their main()s and the
# precompiled header), after the build type's flags so that it wins: O0, O1, O2, O3, Os, Og;
# empty (the default) keeps the build type's. The `default` preset sets O1: README's test
# command builds the whole suite in about two thirds of the CPU time it takes at -O2
# (bench/README.md, "README command 2"); the examples, train_gpt included, stay at the build
# type's -O2, and the `ci` preset (what .ci/run tests) builds everything at -O2. The
# layout stress programs (tests/layout_stress) set their levels themselves, -O0 and -O2.
set(ZEST_TEST_OPT_LEVEL "" CACHE STRING
    "Optimisation level of the test programs: O0, O1, O2, O3, Os or Og; empty: the build type's")
if(NOT ZEST_TEST_OPT_LEVEL STREQUAL "" AND NOT ZEST_TEST_OPT_LEVEL MATCHES "^O[0123sg]$")
  message(FATAL_ERROR "zest: ZEST_TEST_OPT_LEVEL is '${ZEST_TEST_OPT_LEVEL}'; it must be one of "
                      "O0, O1, O2, O3, Os, Og, or empty for the build type's level")
endif()

# Gives a test program's target the tests' optimisation level (ZEST_TEST_OPT_LEVEL).
function(zest_test_optimize target)
  if(NOT ZEST_TEST_OPT_LEVEL STREQUAL "")
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-${ZEST_TEST_OPT_LEVEL}>")
  endif()
endfunction()

option(ZEST_TEST_MPI_POLITE_WAIT
       "Make blocking MPI calls in MPI tests yield the CPU while they wait (see tests/support/mpi_polite_wait.cpp)"
       ON)

# Every test runs single-threaded BLAS: several ranks share few cores, and OpenBLAS's
# threads spin while they wait, just like MPI's progress loop.
set(ZEST_TEST_ENVIRONMENT OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1)

# The two main()s, compiled once and linked into every test (object libraries).
function(zest_testing_setup)
  if(TARGET zest_test_doctest_main)
    return()
  endif()
  set(support "${PROJECT_SOURCE_DIR}/tests/support")
  add_library(zest_test_doctest_main OBJECT "${support}/doctest_main.cpp")
  target_link_libraries(zest_test_doctest_main PUBLIC doctest::doctest)
  zest_enable_warnings(zest_test_doctest_main)
  zest_test_optimize(zest_test_doctest_main)

  # Without MPI (ZEST_WITH_MPI=OFF) zest_add_test skips the MPI tests: no MPI main.
  if(ZEST_HAS_MPI)
    add_library(zest_test_mpi_main OBJECT "${support}/mpi_main.cpp")
    if(ZEST_TEST_MPI_POLITE_WAIT)
      target_sources(zest_test_mpi_main PRIVATE "${support}/mpi_polite_wait.cpp")
    endif()
    target_include_directories(zest_test_mpi_main PUBLIC "${PROJECT_SOURCE_DIR}/tests")
    target_link_libraries(zest_test_mpi_main PUBLIC zest::zest doctest::doctest)
    zest_enable_warnings(zest_test_mpi_main)
    zest_test_optimize(zest_test_mpi_main)
  endif()

  # The headers every test parses, precompiled once; the tests reuse it (zest_add_test).
  # The compiler takes a precompiled header only when it was built with the same options,
  # and includes the headers themselves otherwise, so a test with flags of its own still
  # builds the same. It puts zest/zest.hpp before a test's own includes, so a missing
  # include in a test file goes unnoticed here; the clang build (no precompiled header)
  # and the consumer tests still see it.
  if(ZEST_TEST_PRECOMPILED_HEADER)
    add_library(zest_test_pch OBJECT "${support}/precompiled.cpp")
    target_include_directories(zest_test_pch PRIVATE "${PROJECT_SOURCE_DIR}/tests")
    target_link_libraries(zest_test_pch PRIVATE zest::zest doctest::doctest)
    zest_enable_warnings(zest_test_pch)
    zest_test_optimize(zest_test_pch)
    target_precompile_headers(zest_test_pch PRIVATE <zest/zest.hpp> <doctest/doctest.h>)
  endif()

  # What a program linking zest::zest is compiled with (transitively: Eigen, MPI, BLAS),
  # for the tests that run a compiler themselves (compile_fail, cuda).
  set(usage_flags "${PROJECT_BINARY_DIR}/tests/zest_usage_flags.cmake")
  file(GENERATE OUTPUT "${usage_flags}" CONTENT
"set(ZEST_USAGE_INCLUDES [==[$<TARGET_PROPERTY:zest,INTERFACE_INCLUDE_DIRECTORIES>]==])
set(ZEST_USAGE_DEFINITIONS [==[$<TARGET_PROPERTY:zest,INTERFACE_COMPILE_DEFINITIONS>]==])
set(ZEST_USAGE_OPTIONS [==[$<TARGET_PROPERTY:zest,INTERFACE_COMPILE_OPTIONS>]==])
")
  set(ZEST_TEST_USAGE_FLAGS "${usage_flags}" PARENT_SCOPE)
endfunction()

function(zest_add_test name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "MPI;UNITY" "TIMEOUT" "SOURCES;NPROCS;LABELS;LINK_LIBRARIES;ARGS;SUITES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "zest_add_test(${name}): unknown arguments ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT arg_SOURCES)
    message(FATAL_ERROR "zest_add_test(${name}): SOURCES is required")
  endif()
  if(arg_NPROCS AND NOT arg_MPI)
    message(FATAL_ERROR "zest_add_test(${name}): NPROCS needs MPI")
  endif()
  set(target "zest_test_${name}")
  if(arg_MPI AND NOT ZEST_HAS_MPI)
    # A build without MPI (ZEST_WITH_MPI=OFF) has the tests that run in one process only.
    set_property(GLOBAL APPEND PROPERTY ZEST_TESTS_SKIPPED_WITHOUT_MPI "${name}")
    return()
  endif()
  if(TARGET "${target}")
    message(FATAL_ERROR "zest_add_test(${name}): a test of that name exists already")
  endif()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT ${ZEST_TEST_TIMEOUT})
  endif()

  add_executable(${target} ${arg_SOURCES})
  set_target_properties(${target} PROPERTIES OUTPUT_NAME "${name}")
  # Tests include their helpers from the tests/ root: "support/fixtures.hpp".
  target_include_directories(${target} PRIVATE "${PROJECT_SOURCE_DIR}/tests")
  target_link_libraries(${target} PRIVATE zest::zest doctest::doctest ${arg_LINK_LIBRARIES})
  zest_enable_warnings(${target})
  zest_test_optimize(${target})
  if(TARGET zest_test_pch)
    target_precompile_headers(${target} REUSE_FROM zest_test_pch)
  endif()
  if(arg_UNITY)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 0)
  endif()

  # The tests: <name> running everything, or one per suite running that suite.
  set(tests "${name}")
  if(arg_SUITES)
    set(tests ${arg_SUITES})
  endif()

  if(NOT arg_MPI)
    target_link_libraries(${target} PRIVATE zest_test_doctest_main)
    foreach(test IN LISTS tests)
      set(args ${arg_ARGS})
      if(arg_SUITES)
        list(APPEND args "--test-suite=${test}")
      endif()
      add_test(NAME "${test}" COMMAND ${target} ${args})
      set_tests_properties("${test}" PROPERTIES
        LABELS "${arg_LABELS}"
        TIMEOUT ${arg_TIMEOUT}
        ENVIRONMENT "${ZEST_TEST_ENVIRONMENT}")
    endforeach()
    return()
  endif()

  target_link_libraries(${target} PRIVATE zest_test_mpi_main)
  if(NOT arg_NPROCS)
    set(arg_NPROCS 1 2 4)
  endif()
  foreach(test IN LISTS tests)
    set(args ${arg_ARGS})
    if(arg_SUITES)
      list(APPEND args "--test-suite=${test}")
    endif()
    foreach(n IN LISTS arg_NPROCS)
      add_test(NAME "${test}_np${n}"
        COMMAND "${MPIEXEC_EXECUTABLE}" ${MPIEXEC_NUMPROC_FLAG} ${n} ${MPIEXEC_PREFLAGS}
                "$<TARGET_FILE:${target}>" ${MPIEXEC_POSTFLAGS} ${args})
      # PROCESSORS: ctest -jN never runs more ranks than N at once (a 4-rank test with -j2
      # runs alone). The TIMEOUT is the last resort behind checked mode's watchdog.
      set_tests_properties("${test}_np${n}" PROPERTIES
        LABELS "mpi;${arg_LABELS}"
        PROCESSORS ${n}
        TIMEOUT ${arg_TIMEOUT}
        ENVIRONMENT "${ZEST_TEST_ENVIRONMENT}")
    endforeach()
  endforeach()
endfunction()
