# Programs kept in documents, as ```cpp blocks.
#
# zest_cpp_block(<text> <first-line> <source-var> <after-var>): the first ```cpp block of
# <text> whose first line starts with <first-line>: its text (up to and with its last newline)
# and what follows it; both empty when there is none. A block that does not end is an error.
function(zest_cpp_block text first source_var after_var)
  set(${source_var} "" PARENT_SCOPE)
  set(${after_var} "" PARENT_SCOPE)
  string(FIND "${text}" "```cpp\n${first}" start)
  if(start EQUAL -1)
    return()
  endif()
  math(EXPR body "${start} + 7")  # past "```cpp\n"
  string(SUBSTRING "${text}" ${body} -1 rest)
  string(FIND "${rest}" "\n```" end)
  if(end EQUAL -1)
    message(FATAL_ERROR "a ```cpp block starting with \"${first}\" does not end")
  endif()
  math(EXPR end "${end} + 1")  # keep the last newline
  string(SUBSTRING "${rest}" 0 ${end} source)
  string(SUBSTRING "${rest}" ${end} -1 after)
  set(${source_var} "${source}" PARENT_SCOPE)
  set(${after_var} "${after}" PARENT_SCOPE)
endfunction()

# zest_doc_programs(<file.md> <prefix> <names-var> <sources-var>): the whole programs of a
# document, each a ```cpp block whose first line is "// <prefix>/<name>.cpp"; their names (a
# list) and, for each name, its text in <sources-var>_<name>. A document without any, or
# with two of one name, is an error.
function(zest_doc_programs doc prefix names_var sources_var)
  file(READ "${doc}" text)
  set(names "")
  while(TRUE)
    zest_cpp_block("${text}" "// ${prefix}/" source text)
    if(source STREQUAL "")
      break()
    endif()
    if(NOT source MATCHES "^// ${prefix}/([a-z_0-9]+)\\.cpp\n")
      message(FATAL_ERROR "${doc}: a program's first line is not \"// ${prefix}/<name>.cpp\"")
    endif()
    set(name "${CMAKE_MATCH_1}")
    if(name IN_LIST names)
      message(FATAL_ERROR "${doc}: two programs are named ${prefix}/${name}.cpp")
    endif()
    list(APPEND names "${name}")
    set(${sources_var}_${name} "${source}" PARENT_SCOPE)
  endwhile()
  if(NOT names)
    message(FATAL_ERROR "${doc}: no ```cpp block starting with \"// ${prefix}/<name>.cpp\"")
  endif()
  set(${names_var} "${names}" PARENT_SCOPE)
endfunction()
