// The main() of every chorus test binary, compiled once (see //tests:catch_main).
// Kept alone in its file because this one translation unit costs 12-29 s to compile.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
