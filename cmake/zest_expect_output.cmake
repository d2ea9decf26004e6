# zest_expect_output.cmake — run a command, check its exit status and its output.
#
#   cmake -DCOMMAND=<cmd;args...> [-DEXPECT_FAILURE=ON] -DEXPECT=<regex;regex...> \
#         -P zest_expect_output.cmake
#
# In COMMAND, `|` also separates arguments (add_test splits unescaped `;` itself), so
# "-DCOMMAND=mpiexec|-n|2|prog|--flag" runs mpiexec -n 2 prog --flag.
#
# Passes when the command exits non-zero if EXPECT_FAILURE (zero otherwise) and every regex
# in EXPECT matches its combined stdout and stderr, in any order (MPI ranks' lines arrive
# through separate pipes, so their order is not fixed). Prints the output either way.
cmake_minimum_required(VERSION 3.21)

if(NOT COMMAND)
  message(FATAL_ERROR "zest_expect_output: COMMAND is required")
endif()
string(REPLACE "|" ";" COMMAND "${COMMAND}")
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE status OUTPUT_VARIABLE output
                ERROR_VARIABLE output)
message("${output}")

set(problems "")
if(EXPECT_FAILURE AND status EQUAL 0)
  string(APPEND problems "  expected a non-zero exit status, got 0\n")
elseif(NOT EXPECT_FAILURE AND NOT status EQUAL 0)
  string(APPEND problems "  expected exit status 0, got ${status}\n")
endif()
foreach(regex IN LISTS EXPECT)
  if(NOT output MATCHES "${regex}")
    string(APPEND problems "  output does not match: ${regex}\n")
  endif()
endforeach()
if(problems)
  message(FATAL_ERROR "zest_expect_output: ${COMMAND}\n${problems}")
endif()
message(STATUS "zest_expect_output: exit status ${status} and output as expected")
