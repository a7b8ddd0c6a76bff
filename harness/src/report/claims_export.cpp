#include "claims_export.h"

#include <string>
#include <utility>
#include <vector>

#include "tabular.h"

namespace chiar::report {
namespace {

// One field of a record: its column, its text, and whether JSON writes it
// as a number (an empty number is null).
struct Field {
  const char* column;
  std::string text;
  bool number;
};

Field text(const char* column, const std::string& value) { return {column, value, false}; }
Field number(const char* column, double value) { return {column, number_cell(value), true}; }
Field flag(const char* column, bool value) { return {column, value ? "true" : "false", true}; }

// Values as stored: accuracy and shares as fractions, a reduction's cut in
// percent; estimate, lo and hi are at the table's simultaneous confidence.
std::vector<Field> record(const ClaimsTable& table, const Claim& claim, const TaskTest* row) {
  const TaskTest empty;
  const TaskTest& r = row ? *row : empty;
  const bool test = r.test.has_value();
  const bool of_difference = tests_a_difference(claim.kind);
  return {text("claim", claim.id),
          text("kind", claim.kind),
          text("claim_verdict", claim.verdict),
          text("claim_detail", claim.detail),
          text("task", r.task),
          text("metric", r.metric),
          text("variant_a", r.a),
          text("variant_b", r.b),
          number("n_a", row ? r.n_a : NAN),
          number("n_b", row && !r.b.empty() ? r.n_b : NAN),
          text("left_out", r.left_out),
          text("missing", row ? r.missing : claim.measured),
          number("mean_a", r.mean_a),
          number("mean_b", r.mean_b),
          number("estimate", r.estimate),
          number("lo", r.lo),
          number("hi", r.hi),
          number("confidence", r.confidence),
          number("tests", table.tests),
          number("raw_lo_95", r.raw_lo),
          number("raw_hi_95", r.raw_hi),
          text("test", !test                   ? ""
                       : of_difference         ? (r.test->paired ? "paired" : "welch")
                       : claim.kind == "share" ? "one-sample logit"
                                               : "one-sample"),
          number("df", test ? r.test->df : NAN),
          number("p", test && of_difference && !r.no_spread ? r.test->p : NAN),
          number("p_bonferroni", r.p_adjusted),
          number("p_holm", r.p_holm),
          number("sequential_boundary", r.boundary),
          number("effect_size", test && of_difference ? r.test->effect : NAN),
          flag("no_spread", r.no_spread),
          text("paper_effect", r.paper_effect),
          text("equivalence", r.equivalence),
          number("equivalence_p", r.equivalence_p),
          text("verdict", row ? r.verdict : claim.verdict),
          text("direction", r.direction),
          text("note", r.note)};
}

// Every record: a claim's tasks, or one record for a claim about no task.
template <class Write>
void each_record(const ClaimsTable& table, Write&& write) {
  for (const auto& claim : table.claims) {
    if (claim.tasks.empty()) write(record(table, claim, nullptr));
    for (const auto& row : claim.tasks) write(record(table, claim, &row));
  }
}

}  // namespace

void write_claims_csv(const ClaimsTable& table, std::ostream& out) {
  const auto header = record(table, Claim{}, nullptr);
  for (size_t i = 0; i < header.size(); ++i) out << (i ? "," : "") << header[i].column;
  out << "\n";
  each_record(table, [&](const std::vector<Field>& fields) {
    for (size_t i = 0; i < fields.size(); ++i) out << (i ? "," : "") << csv_cell(fields[i].text);
    out << "\n";
  });
}

void write_claims_json(const ClaimsTable& table, std::ostream& out) {
  out << "[";
  bool first = true;
  each_record(table, [&](const std::vector<Field>& fields) {
    out << (first ? "\n {" : ",\n {");
    first = false;
    for (size_t i = 0; i < fields.size(); ++i) {
      const Field& f = fields[i];
      out << (i ? ", " : "") << json_string(f.column) << ": "
          << (!f.number        ? json_string(f.text)
              : f.text.empty() ? "null"
                               : f.text);
    }
    out << "}";
  });
  out << "\n]\n";
}

}  // namespace chiar::report
