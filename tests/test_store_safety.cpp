// test_store_safety
#include <catch2/catch.hpp>
