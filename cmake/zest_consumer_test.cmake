# zest_consumer_test.cmake — build and run a consumer project of zest (tests/consumer/).
#
#   cmake -DMODE=find_package|add_subdirectory -DZEST_SOURCE_DIR=... -DZEST_BINARY_DIR=...
#         -DWORK_DIR=... -DGENERATOR=... [-DMAKE_PROGRAM=...] -DCXX_COMPILER=...
#         [-DBUILD_TYPE=...] -P zest_consumer_test.cmake
#
# find_package: installs the build tree ZEST_BINARY_DIR into WORK_DIR/prefix and builds
# tests/consumer/find_package against that prefix (checking that zest came from there).
# add_subdirectory: builds tests/consumer/add_subdirectory on the source tree.
# Either way the consumer's executable must then run and exit 0.
cmake_minimum_required(VERSION 3.21)

function(run)
  list(JOIN ARGN " " shown)
  message(STATUS "${shown}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE output
                  ERROR_VARIABLE output)
  message("${output}")
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "zest_consumer_test (${MODE}): failed with status ${status}: ${shown}")
  endif()
  set(run_output "${output}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(configure_args -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
if(MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(BUILD_TYPE)
  list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
endif()

if(MODE STREQUAL "find_package")
  set(prefix "${WORK_DIR}/prefix")
  run("${CMAKE_COMMAND}" --install "${ZEST_BINARY_DIR}" --prefix "${prefix}")
  run("${CMAKE_COMMAND}" -S "${ZEST_SOURCE_DIR}/tests/consumer/find_package"
      -B "${WORK_DIR}/build" ${configure_args} "-DCMAKE_PREFIX_PATH=${prefix}"
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
  string(FIND "${run_output}" "zest_DIR: ${prefix}/" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "zest_consumer_test: find_package(zest) did not find the zest "
                        "installed in ${prefix}")
  endif()
elseif(MODE STREQUAL "add_subdirectory")
  run("${CMAKE_COMMAND}" -S "${ZEST_SOURCE_DIR}/tests/consumer/add_subdirectory"
      -B "${WORK_DIR}/build" ${configure_args} "-DZEST_SOURCE_DIR=${ZEST_SOURCE_DIR}")
else()
  message(FATAL_ERROR "zest_consumer_test: MODE must be find_package or add_subdirectory")
endif()

run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
