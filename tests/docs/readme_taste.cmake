# zest_readme_taste(<README.md> <source-var> <command-var>): README's taste program (the
# ```cpp block whose first line is "// taste.cpp") and the command line that builds and runs
# it (the first line of the ```sh block right after it). A README without them is an error
# that says what is missing.
include("${CMAKE_CURRENT_LIST_DIR}/doc_programs.cmake")
function(zest_readme_taste readme source_var command_var)
  file(READ "${readme}" text)
  zest_cpp_block("${text}" "// taste.cpp\n" source after)
  if(source STREQUAL "")
    message(FATAL_ERROR "${readme}: no ```cpp block starting with the line \"// taste.cpp\" "
                        "(tests/docs checks README's taste program)")
  endif()
  if(NOT after MATCHES "^```\n+```sh\n([^\n]+)\n")
    message(FATAL_ERROR "${readme}: the taste is not followed by a ```sh block with its "
                        "build-and-run command")
  endif()
  set(${source_var} "${source}" PARENT_SCOPE)
  set(${command_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()
