// test_faults
#include <catch2/catch.hpp>
