# zest_compile_fail.cmake — compile one test case and check the compiler's verdict.
#
#   cmake -DCOMPILER=<c++ or nvcc> -DSOURCE=<case.cpp> -DOBJECT=<out.o>
#         -DUSAGE_FLAGS=<file> [-DFLAGS=<flag;flag...>] [-DOPTION_PREFIX=-Xcompiler=]
#         -P zest_compile_fail.cmake
#
# A case starts with its expectation, in its first lines:
#   // expect: <text>        compilation must FAIL and <text> must appear within the first
#                            10 lines of the compiler's output (users read the top of an
#                            error, not page 40); several `// expect:` lines must all appear
#   // expect-compiles       compilation must succeed (a sanity case: the flags are right)
# The text is matched literally (no regex) and must not contain ';'.
#
# USAGE_FLAGS is a file written at configure time (tests/CMakeLists.txt) that sets
# ZEST_USAGE_INCLUDES, ZEST_USAGE_DEFINITIONS and ZEST_USAGE_OPTIONS from zest::zest's
# usage requirements, transitively: the include directories (zest's, Eigen's, MPI's, ...),
# definitions and options that a program linking zest::zest is compiled with.
cmake_minimum_required(VERSION 3.21)

foreach(var COMPILER SOURCE OBJECT USAGE_FLAGS)
  if(NOT ${var})
    message(FATAL_ERROR "zest_compile_fail: ${var} is required")
  endif()
endforeach()
include("${USAGE_FLAGS}")

# The expectation.
file(STRINGS "${SOURCE}" header LIMIT_COUNT 10)
set(expected "")
set(expect_compiles FALSE)
foreach(line IN LISTS header)
  if(line MATCHES "^// expect: (.+)$")
    list(APPEND expected "${CMAKE_MATCH_1}")
  elseif(line MATCHES "^// expect-compiles")
    set(expect_compiles TRUE)
  else()
    break()
  endif()
endforeach()
if(NOT expected AND NOT expect_compiles)
  message(FATAL_ERROR "zest_compile_fail: ${SOURCE} must start with `// expect: <text>` "
                      "or `// expect-compiles`")
endif()

# The command: the same includes and definitions as a user's target linking zest::zest.
set(command "${COMPILER}" ${FLAGS})
foreach(dir IN LISTS ZEST_USAGE_INCLUDES)
  list(APPEND command "-I${dir}")
endforeach()
foreach(definition IN LISTS ZEST_USAGE_DEFINITIONS)
  list(APPEND command "-D${definition}")
endforeach()
foreach(option IN LISTS ZEST_USAGE_OPTIONS)
  list(APPEND command "${OPTION_PREFIX}${option}")
endforeach()
list(APPEND command -c "${SOURCE}" -o "${OBJECT}")

list(JOIN command " " shown)
message(STATUS "${shown}")
execute_process(COMMAND ${command} RESULT_VARIABLE status OUTPUT_VARIABLE output
                ERROR_VARIABLE output)

if(expect_compiles)
  if(NOT status EQUAL 0)
    message("${output}")
    message(FATAL_ERROR "compile_fail: expected to compile, but the compiler failed (see above)")
  endif()
  message(STATUS "compiles, as expected")
  return()
endif()

if(status EQUAL 0)
  message(FATAL_ERROR "expected a compile error containing \"${expected}\", "
                      "but ${SOURCE} compiled")
endif()

# The first 10 lines of the output.
set(head "")
set(rest "${output}")
foreach(i RANGE 1 10)
  string(FIND "${rest}" "\n" newline)
  if(newline EQUAL -1)
    string(APPEND head "${rest}")
    set(rest "")
    break()
  endif()
  math(EXPR after "${newline} + 1")
  string(SUBSTRING "${rest}" 0 ${after} line)
  string(APPEND head "${line}")
  string(SUBSTRING "${rest}" ${after} -1 rest)
endforeach()

set(problems "")
foreach(text IN LISTS expected)
  string(FIND "${head}" "${text}" at)
  if(at EQUAL -1)
    string(FIND "${output}" "${text}" anywhere)
    if(anywhere EQUAL -1)
      string(APPEND problems "  \"${text}\" does not appear in the output at all\n")
    else()
      string(SUBSTRING "${output}" 0 ${anywhere} before)
      string(REGEX MATCHALL "\n" newlines "${before}")
      list(LENGTH newlines line_number)
      math(EXPR line_number "${line_number} + 1")
      string(APPEND problems "  \"${text}\" appears only on line ${line_number}, "
                             "not within the first 10\n")
    endif()
  endif()
endforeach()
if(problems)
  # Details as plain text (FATAL_ERROR would re-wrap the compiler's lines).
  message("first 10 lines of the compiler's output:\n${head}\n"
          "the compile error does not say what it should:\n${problems}")
  message(FATAL_ERROR "compile_fail: wrong or late message (see above)")
endif()
message(STATUS "fails to compile with the expected message; first 10 lines:\n${head}")
