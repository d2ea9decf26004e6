# zest_warnings.cmake — warning flags for zest's own targets (tests, examples, benches).
#
# The library target itself carries no warning flags: consumers choose their own. Our own
# programs compile zest's headers with -Wall -Wextra -Wpedantic, and with -Werror when
# ZEST_WARNINGS_AS_ERRORS is ON (the `ci` preset). Eigen, MPI and doctest come in through
# imported targets, whose include directories are SYSTEM, so their warnings stay quiet.
include_guard(GLOBAL)

function(zest_enable_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    # C++ sources only: a target may also hold .cu files, whose nvcc takes other flags.
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>)
    # g++ 12 at -O2 reports std::variant<std::string, ...> members (zest::json::value) as
    # "may be used uninitialized" after inlining moves; every report seen was a false
    # positive inside libstdc++, so the warning is off for GNU.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-maybe-uninitialized>)
    endif()
    if(ZEST_WARNINGS_AS_ERRORS)
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
    endif()
  elseif(MSVC)
    target_compile_options(${target} PRIVATE /W4 $<$<BOOL:${ZEST_WARNINGS_AS_ERRORS}>:/WX>)
  endif()
endfunction()
