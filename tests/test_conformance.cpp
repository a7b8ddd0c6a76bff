#include <catch2/catch.hpp>

#include "../harness/src/core/registry.h"
#include "chiar/conformance.h"
#include "support/fixtures.h"
#include "support/temp_dir.h"

using namespace chiar;

namespace {

std::function<std::shared_ptr<Operator>(int64_t, int64_t)> op_maker(const PluginRegistry& r, const std::string& name) {
  return [&r, name](int64_t d, int64_t heads) {
    OperatorSpec spec;
    spec.d_model = d;
    spec.n_heads = heads;
    if (name == "rbf") spec.params.set("chunk", int64_t{4});
    return r.make_operator(name, spec);
  };
}

}  // namespace

TEST_CASE("every in-tree operator and router passes the conformance checks", "[conformance]") {
  for (const auto& e : test::plugins().entries()) {
    INFO(e.kind << " " << e.name);
    if (e.kind == "operator") CHECK(check_operator(op_maker(test::plugins(), e.name)).empty());
    if (e.kind == "router")
      CHECK(check_router([&](const std::vector<std::string>& ops) {
              RouterSpec spec;
              spec.d_model = 16;
              spec.operators = ops;
              return test::plugins().make_router(e.name, spec);
            }).empty());
  }
}

TEST_CASE("in-tree tasks pass the conformance checks", "[conformance]") {
  test::TempDir d("conf");
  for (const char* split : {"train", "valid", "test"}) d.write(std::string("c/wiki.") + split + ".tokens", "a b c d e f g h\ni j k\n");
  TaskSpec lm;
  lm.params.set("path", std::string("c")).set("seq_len", int64_t{4});
  lm.data_root = d.path();
  CHECK(check_task(*test::plugins().make_task("wikitext", lm)).empty());
  TaskSpec flat;
  flat.params.set("n_train", int64_t{30}).set("n_valid", int64_t{5}).set("n_test", int64_t{5});
  CHECK(check_task(*test::plugins().make_task("listops_flat", flat)).empty());
}

TEST_CASE("the conformance checks catch broken operators", "[conformance]") {
  PluginRegistry r;
  r.load_file(std::string(CHIAR_TEST_PLUGIN_DIR) + "/peeking/libchiar_peeking.so");
  const auto peeking = check_operator(op_maker(r, "peeking"));
  REQUIRE_FALSE(peeking.empty());
  CHECK_THAT(peeking[0], Catch::Matchers::StartsWith("causality: outputs at t <= 4 change when tokens after 4 change"));
  const auto mismatch = check_operator(op_maker(r, "rows_mismatch"));
  REQUIRE(mismatch.size() == 1);
  CHECK_THAT(mismatch[0], Catch::Matchers::StartsWith("forward_rows disagrees with the rows of forward"));
}
