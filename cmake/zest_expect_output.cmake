# zest_expect_output.cmake — run a command, check its exit status and its output.
#
#   cmake -DCOMMAND=<cmd;args...> [-DEXPECT_FAILURE=ON | -DEXPECT_STATUS=<n>] \
#         -DEXPECT=<regex;regex...> [-DREJECT=<regex;regex...>] [-DREPEAT=<n>] \
#         -P zest_expect_output.cmake
#
# In COMMAND, `|` also separates arguments (add_test splits unescaped `;` itself), so
# "-DCOMMAND=mpiexec|-n|2|prog|--flag" runs mpiexec -n 2 prog --flag.
#
# Passes when the command exits with EXPECT_STATUS if given, else non-zero if EXPECT_FAILURE
# (zero otherwise), every regex in EXPECT matches its combined stdout and stderr, in any order
# (MPI ranks' lines arrive through separate pipes, so their order is not fixed), and no regex
# in REJECT does. REPEAT runs the command that many times (default 1), every run checked: for
# outcomes that a race could change. Prints the output either way.
cmake_minimum_required(VERSION 3.21)

if(NOT COMMAND)
  message(FATAL_ERROR "zest_expect_output: COMMAND is required")
endif()
if(NOT DEFINED REPEAT)
  set(REPEAT 1)
endif()
if(NOT REPEAT MATCHES "^[1-9][0-9]*$")
  message(FATAL_ERROR "zest_expect_output: REPEAT must be a positive count, not '${REPEAT}'")
endif()
if(DEFINED EXPECT_STATUS AND NOT EXPECT_STATUS MATCHES "^[0-9]+$")
  message(FATAL_ERROR "zest_expect_output: EXPECT_STATUS must be a number, not '${EXPECT_STATUS}'")
endif()
string(REPLACE "|" ";" COMMAND "${COMMAND}")

foreach(run RANGE 1 ${REPEAT})
  execute_process(COMMAND ${COMMAND} RESULT_VARIABLE status OUTPUT_VARIABLE output
                  ERROR_VARIABLE output)
  message("${output}")

  set(problems "")
  if(DEFINED EXPECT_STATUS)
    if(NOT status STREQUAL EXPECT_STATUS)
      string(APPEND problems "  expected exit status ${EXPECT_STATUS}, got ${status}\n")
    endif()
  elseif(EXPECT_FAILURE AND status EQUAL 0)
    string(APPEND problems "  expected a non-zero exit status, got 0\n")
  elseif(NOT EXPECT_FAILURE AND NOT status EQUAL 0)
    string(APPEND problems "  expected exit status 0, got ${status}\n")
  endif()
  foreach(regex IN LISTS EXPECT)
    if(NOT output MATCHES "${regex}")
      string(APPEND problems "  output does not match: ${regex}\n")
    endif()
  endforeach()
  foreach(regex IN LISTS REJECT)
    if(output MATCHES "${regex}")
      string(APPEND problems "  output matches what it must not: ${regex}\n")
    endif()
  endforeach()
  if(problems)
    if(REPEAT GREATER 1)
      string(PREPEND problems "  (run ${run} of ${REPEAT})\n")
    endif()
    message(FATAL_ERROR "zest_expect_output: ${COMMAND}\n${problems}")
  endif()
endforeach()
message(STATUS "zest_expect_output: exit status ${status} and output as expected")
