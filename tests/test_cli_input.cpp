// test_cli_input
#include <catch2/catch.hpp>
