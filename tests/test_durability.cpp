// test_durability
#include <catch2/catch.hpp>
