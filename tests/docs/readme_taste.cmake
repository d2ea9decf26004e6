# zest_readme_taste(<README.md> <source-var> <command-var>): README's taste program (the
# ```cpp block whose first line is "// taste.cpp") and the command line that builds and runs
# it (the first line of the ```sh block right after it). A README without them is an error
# that says what is missing.
function(zest_readme_taste readme source_var command_var)
  file(READ "${readme}" text)
  string(FIND "${text}" "```cpp\n// taste.cpp\n" start)
  if(start EQUAL -1)
    message(FATAL_ERROR "${readme}: no ```cpp block starting with the line \"// taste.cpp\" "
                        "(tests/docs checks README's taste program)")
  endif()
  math(EXPR start "${start} + 7")  # past "```cpp\n"
  string(SUBSTRING "${text}" ${start} -1 rest)
  string(FIND "${rest}" "\n```" end)
  if(end EQUAL -1)
    message(FATAL_ERROR "${readme}: the taste's ```cpp block does not end")
  endif()
  math(EXPR end "${end} + 1")  # keep the last newline
  string(SUBSTRING "${rest}" 0 ${end} source)
  string(SUBSTRING "${rest}" ${end} -1 after)
  if(NOT after MATCHES "^```\n+```sh\n([^\n]+)\n")
    message(FATAL_ERROR "${readme}: the taste is not followed by a ```sh block with its "
                        "build-and-run command")
  endif()
  set(${source_var} "${source}" PARENT_SCOPE)
  set(${command_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()
