// tests/support/doctest_main.cpp — main() of every single-process test.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
