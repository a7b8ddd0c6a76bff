#include <catch2/catch.hpp>

#include "chiar/registry.h"
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

// Each failure the checks return, one per line.
std::string lines(const std::vector<std::string>& failures) {
  std::string out;
  for (const auto& f : failures) out += (out.empty() ? "" : "\n") + f;
  return out;
}

}  // namespace

// A failed check prints every failure of the conformance checks, not only
// that their list was not empty.
#define CHECK_CONFORMS(failures_expression)                                        \
  do {                                                                             \
    const std::vector<std::string> failures = (failures_expression);               \
    INFO(failures.size() << " conformance check(s) failed:\n" << lines(failures)); \
    CHECK(failures.empty());                                                       \
  } while (false)

TEST_CASE("every in-tree operator and router passes the conformance checks", "[conformance]") {
  for (const auto& e : test::plugins().entries()) {
    INFO(e.kind << " " << e.name);
    if (e.kind == "operator") CHECK_CONFORMS(check_operator(op_maker(test::plugins(), e.name)));
    if (e.kind == "router")
      CHECK_CONFORMS(check_router([&](const std::vector<std::string>& ops) {
        RouterSpec spec;
        spec.d_model = 16;
        spec.operators = ops;
        return test::plugins().make_router(e.name, spec);
      }));
  }
}

TEST_CASE("in-tree tasks pass the conformance checks", "[conformance]") {
  test::TempDir d("conf");
  for (const char* split : {"train", "valid", "test"})
    d.write(std::string("c/wiki.") + split + ".tokens", "a b c d e f g h\ni j k\n");
  TaskSpec lm;
  lm.params.set("path", std::string("c")).set("seq_len", int64_t{4});
  lm.data_root = d.path();
  CHECK_CONFORMS(check_task(*test::plugins().make_task("wikitext", lm)));
  TaskSpec flat;
  flat.params.set("n_train", int64_t{30}).set("n_valid", int64_t{5}).set("n_test", int64_t{5});
  CHECK_CONFORMS(check_task(*test::plugins().make_task("listops_flat", flat)));
}

TEST_CASE("the conformance checks catch broken operators", "[conformance]") {
  PluginRegistry r;
  r.load_file(std::string(CHIAR_TEST_PLUGIN_DIR) + "/peeking/libchiar_peeking.so");
  const auto peeking = check_operator(op_maker(r, "peeking"));
  INFO("peeking fails:\n" << lines(peeking));
  REQUIRE_FALSE(peeking.empty());
  CHECK_THAT(peeking[0], Catch::Matchers::StartsWith("causality: outputs at t <= 4 change when tokens after 4 change"));
  const auto mismatch = check_operator(op_maker(r, "rows_mismatch"));
  INFO("rows_mismatch fails:\n" << lines(mismatch));
  REQUIRE(mismatch.size() == 2);  // with and without the rows in host memory
  CHECK_THAT(mismatch[0], Catch::Matchers::StartsWith("forward_rows disagrees with the rows of forward"));
  CHECK_THAT(mismatch[1],
             Catch::Matchers::StartsWith("forward_rows given OpContext::host_rows disagrees with the rows of forward"));
  const auto misread = check_operator(op_maker(r, "host_rows_misread"));
  INFO("host_rows_misread fails:\n" << lines(misread));
  REQUIRE(misread.size() == 1);
  CHECK_THAT(misread[0],
             Catch::Matchers::StartsWith("forward_rows given OpContext::host_rows disagrees with the rows of forward"));
}
