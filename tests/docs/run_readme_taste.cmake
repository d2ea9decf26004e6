# Runs README.md's taste and checks its exit status and what it prints.
#   as built by CMake:  cmake -DPROGRAM=<exe> -DMPIEXEC=<mpiexec> -DEXPECT=<regex> -P run_readme_taste.cmake
#   as a newcomer would: cmake -DREADME=<README.md> -DINCLUDE=<repo>/include -DWORK=<scratch>
#                              -DEXPECT=<regex> -P run_readme_taste.cmake
# The second writes taste.cpp into WORK next to a link to the repository's include/ and runs
# README's build-and-run command, verbatim, through sh.
cmake_minimum_required(VERSION 3.21)
if(PROGRAM)
  set(command "${MPIEXEC}" -n 2 "${PROGRAM}")
  set(where "${CMAKE_CURRENT_BINARY_DIR}")
else()
  include("${CMAKE_CURRENT_LIST_DIR}/readme_taste.cmake")
  zest_readme_taste("${README}" source line)
  file(REMOVE_RECURSE "${WORK}")
  file(MAKE_DIRECTORY "${WORK}")
  file(WRITE "${WORK}/taste.cpp" "${source}")
  file(CREATE_LINK "${INCLUDE}" "${WORK}/include" SYMBOLIC)
  set(command sh -c "${line}")
  set(where "${WORK}")
endif()
list(JOIN command " " shown)
message(STATUS "in ${where}: ${shown}")
execute_process(COMMAND ${command} WORKING_DIRECTORY "${where}" RESULT_VARIABLE status
                OUTPUT_VARIABLE output ERROR_VARIABLE output)
message("${output}")
if(NOT status EQUAL 0)
  message(FATAL_ERROR "README's taste failed (status ${status})")
endif()
if(NOT output MATCHES "${EXPECT}")
  message(FATAL_ERROR "README's taste did not print what README.md says (${EXPECT})")
endif()
