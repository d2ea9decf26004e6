// The translation unit that the tests' precompiled header is built from (see
// cmake/zest_testing.cmake): the header itself is all there is.
