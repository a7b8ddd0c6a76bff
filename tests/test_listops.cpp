#include <ATen/Parallel.h>
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "chiar/error.h"
#include "chiar/listops.h"
#include "support/temp_dir.h"
#include "support/skip.h"

using namespace chiar;

namespace {

// Depth, argument counts and LRA length of an expression, from its tokens.
struct Shape {
  int64_t depth = 0, length = 0, min_args = 1 << 30, max_args = 0;
};
Shape shape_of(const std::string& source) {
  Shape s;
  std::vector<int64_t> args;  // per open operator
  for (const auto& t : listops_tokens(source)) {
    ++s.length;
    if (t[0] == '[') {
      if (!args.empty()) ++args.back();
      args.push_back(0);
      s.depth = std::max<int64_t>(s.depth, static_cast<int64_t>(args.size()));
    } else if (t == "]") {
      s.min_args = std::min(s.min_args, args.back());
      s.max_args = std::max(s.max_args, args.back());
      args.pop_back();
    } else if (!args.empty()) {
      ++args.back();
      s.depth = std::max<int64_t>(s.depth, static_cast<int64_t>(args.size()) + 1);
    }
  }
  return s;
}

}  // namespace

TEST_CASE("evaluator: LRA semantics", "[listops]") {
  CHECK(evaluate_listops("( ( ( [MAX 2 ) 9 ) ] )") == 9);
  CHECK(evaluate_listops("[MIN 4 2 7 ]") == 2);
  CHECK(evaluate_listops("[MED 1 9 4 ]") == 4);
  CHECK(evaluate_listops("[MED 1 4 8 9 ]") == 6);  // floor((4 + 8) / 2)
  CHECK(evaluate_listops("[MED 1 2 ]") == 1);      // floor(1.5)
  CHECK(evaluate_listops("[SM 9 8 7 ]") == 4);     // 24 mod 10
  CHECK(evaluate_listops("[MEAN 9 8 ]") == 8);
  CHECK(evaluate_listops("[MAX [MIN 3 5 ] [SM 9 9 ] 1 ]") == 8);
  CHECK(evaluate_listops("7") == 7);
  CHECK_THROWS_WITH(evaluate_listops("[MAX 1 2"), "listops: unclosed operator [MAX");
  CHECK_THROWS_WITH(evaluate_listops("[POW 1 2 ]"), "listops: unknown operator '[POW'");
  CHECK_THROWS_WITH(evaluate_listops("1 2"), "listops: expected one value, found 2");
  CHECK_THROWS_WITH(evaluate_listops("[MAX ]"), "listops: operator [MAX has no arguments");
  CHECK(listops_tokens("( ( ( [MAX 2 ) 9 ) ] )") == std::vector<std::string>{"[MAX", "2", "9", "]"});
}

TEST_CASE("generator: LRA's constraints hold and labels equal the evaluator", "[listops]") {
  ListOpsOptions o;
  o.min_length = 60;
  o.max_length = 400;
  o.max_depth = 6;
  o.max_args = 5;
  const auto examples = generate_listops(300, 11, o);
  REQUIRE(examples.size() == 300);
  std::set<std::string> distinct;
  for (const auto& e : examples) {
    const Shape s = shape_of(e.source);
    CHECK(s.length > o.min_length);
    CHECK(s.length < o.max_length);
    CHECK(s.depth <= o.max_depth);
    CHECK(s.min_args >= 2);
    CHECK(s.max_args <= o.max_args);
    CHECK(e.target == evaluate_listops(e.source));
    distinct.insert(e.source);
  }
  CHECK(distinct.size() == examples.size());
}

TEST_CASE("generator: the same seed gives the same bytes, whatever the thread count", "[listops]") {
  ListOpsOptions o;
  o.min_length = 30;
  o.max_length = 200;
  at::set_num_threads(1);
  const auto one = generate_listops(200, 5, o);
  at::set_num_threads(2);
  const auto two = generate_listops(200, 5, o);
  REQUIRE(one.size() == two.size());
  for (size_t i = 0; i < one.size(); ++i) CHECK(one[i].source == two[i].source);
  CHECK(generate_listops(5, 6, o)[0].source != one[0].source);
}

TEST_CASE("the flat variant: one operator over 4-8 digits", "[listops]") {
  for (const auto& e : generate_listops_flat(200, 3)) {
    const Shape s = shape_of(e.source);
    CHECK(s.depth == 2);
    CHECK(s.min_args >= 4);
    CHECK(s.max_args <= 8);
    CHECK(e.target == evaluate_listops(e.source));
  }
}

TEST_CASE("TSV: round trip and errors naming file and line", "[listops]") {
  test::TempDir dir("listops");
  const auto examples = generate_listops_flat(5, 1);
  const std::string path = dir.path() + "/x.tsv";
  write_listops_tsv(path, examples);
  const auto back = read_listops_tsv(path);
  REQUIRE(back.size() == 5);
  CHECK(back[3].source == examples[3].source);
  CHECK(back[3].target == examples[3].target);
  const auto fields = dir.write("fields.tsv", "Source\tTarget\n[MAX 1 2 ]\t2\textra\n");
  CHECK_THROWS_WITH(read_listops_tsv(fields), fields + ":2: expected 2 tab-separated fields (Source, Target)");
  const auto label = dir.write("label.tsv", "Source\tTarget\n[MAX 1 2 ]\t2\n[MAX 1 2 ]\t12\n");
  CHECK_THROWS_WITH(read_listops_tsv(label), label + ":3: label '12' is not in 0..9");
  CHECK_THROWS_WITH(read_listops_tsv(dir.path() + "/none.tsv"), dir.path() + "/none.tsv: cannot open the file");
}

TEST_CASE("the LRA-format sample parses and evaluates 20/20", "[listops][data]") {
  const std::string data = test::shared_data();
  if (data.empty()) CHIAR_SKIP("[data]", "../shared/data is absent on this machine");
  const auto sample = read_listops_tsv(data + "/listops/format_sample.tsv");
  REQUIRE(sample.size() == 20);
  int right = 0;
  for (const auto& e : sample) right += evaluate_listops(e.source) == e.target;
  CHECK(right == 20);
}
