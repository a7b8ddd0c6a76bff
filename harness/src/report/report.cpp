#include "report.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <functional>
#include <iomanip>
#include <map>
#include <fstream>
#include <sstream>

#include <boost/filesystem.hpp>

#include "chiar/error.h"
#include "charts.h"
#include "html.h"
#include "claims.h"
#include "claims_export.h"
#include "sequential.h"
#include "equal_time.h"

namespace chiar::report {
namespace {

// "583.12 ± 3.40 (95% CI ± 8.45)"; the CI only from 3 seeds on.
std::string with_spread(const Stat& s, double scale, int digits) {
  std::string out = fixed(s.mean * scale, digits);
  if (s.n >= 2) out += " ± " + fixed(s.std * scale, digits);
  if (s.n >= 3) out += " (95% CI ± " + fixed(s.ci95 * scale, digits) + ")";
  return out;
}

std::string md_escape(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string today() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

// Marks the best value of each column, when there is more than one row to
// compare.
void mark_best(Table& table, const std::vector<std::vector<double>>& rank, const std::vector<bool>& lower) {
  table.best.assign(table.rows.size(), std::vector<bool>(table.header.size(), false));
  for (size_t c = 0; c < table.header.size(); ++c) {
    int best = -1;
    for (size_t r = 0; r < rank[c].size(); ++r) {
      if (std::isnan(rank[c][r])) continue;
      if (best < 0 || (lower[c] ? rank[c][r] < rank[c][best] : rank[c][r] > rank[c][best])) best = static_cast<int>(r);
    }
    if (best >= 0 && table.rows.size() > 1) table.best[best][c] = true;
  }
}

// The report in Markdown and in HTML, written side by side.
struct Pages {
  std::ostringstream md, html;
};

void write_intro(Pages& p, const std::string& title, const std::string& db, const std::string& baseline) {
  p.md << "# " << title << "\n\nGenerated " << today() << " from `" << db << "` by `chiar report`. "
       << "Metrics are on the test split, scored with the best-validation checkpoint; mean ± standard deviation "
          "over seeds, with a 95% confidence interval from 3 seeds on. GFLOPs are forward FLOPs per sequence: as "
          "executed, and as a sparse execution needs them. Speeds are means over the seeds timed on the hardware most "
          "runs used (named at the end), leaving out runs timed under other load or on other hardware (named under "
          "their task's table). Best value per column in **bold**; "
          "reductions and speed-ups are against `"
       << baseline << "`.\n\n";
  p.html
      << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << html_escape(title)
      << "</title>\n<style>body{font-family:Helvetica,Arial,sans-serif;max-width:1200px;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}th,td{border:1px solid #ccc;padding:4px 8px;"
         "text-align:right}th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}"
         ".holds{color:#007a3d}.fails{color:#b00020}.mixed{color:#a05a00}.unknown{color:#777}tr.claim "
         "td{border-top:2px solid #999}figure{margin:1.5em 0}"
         "figcaption{color:#555;font-size:0.9em}.swatch{display:inline-block;width:0.8em;height:0.8em;margin-right:4px}"
         "footer{margin-top:3em;font-size:0.85em;color:#555}</style></head><body>\n<h1>"
      << html_escape(title) << "</h1>\n<p>Generated " << today() << " from <code>" << html_escape(db)
      << "</code> by <code>chiar report</code>. "
      << "Metrics are on the test split, scored with the best-validation checkpoint; mean ± standard deviation over "
         "seeds, with a 95% confidence interval from 3 seeds on. GFLOPs are forward FLOPs per sequence, as executed "
         "and as a sparse execution needs them. Speeds are means over the seeds timed on the hardware most runs used "
         "(named at the end), leaving out runs timed under other load or on other hardware (named under their task's "
         "table). Best value per column in bold; reductions and speed-ups are "
         "against <code>"
      << html_escape(baseline) << "</code>.</p>\n";
}

void write_grid(Pages& p, const Summary& s, const Table& table) {
  p.md << "|";
  p.html << "<table class=\"results\"><tr>";
  for (const auto& h : table.header) {
    p.md << " " << h << " |";
    p.html << "<th>" << html_escape(h) << "</th>";
  }
  p.md << "\n|";
  for (size_t c = 0; c < table.header.size(); ++c) p.md << (c == 0 ? "---|" : "---:|");
  p.md << "\n";
  p.html << "</tr>\n";
  for (size_t r = 0; r < table.rows.size(); ++r) {
    p.md << "|";
    p.html << "<tr>";
    for (size_t c = 0; c < table.rows[r].size(); ++c) {
      const std::string& cell = table.rows[r][c];
      const bool best = table.best[r][c];
      p.md << " " << (best ? "**" + md_escape(cell) + "**" : md_escape(cell)) << " |";
      p.html << "<td>";
      if (c == 0) p.html << "<span class=\"swatch\" style=\"background:" << variant_colour(s, cell) << "\"></span>";
      p.html << (best ? "<strong>" + html_escape(cell) + "</strong>" : html_escape(cell)) << "</td>";
    }
    p.md << "\n";
    p.html << "</tr>\n";
  }
  p.html << "</table>\n";
  p.md << "\n";
}

// The runs of the task whose speeds its table leaves out, if any, and why.
std::string speed_note(const TaskSummary& t) {
  std::string train, eval;
  size_t n_train = 0, n_eval = 0, n_other = 0;
  std::map<std::string, std::string> other;  // timing setup -> its runs
  for (const auto& v : t.variants) {
    for (const RunRow* r : v.other_setup) {
      std::string& runs = other[r->timing_setup.empty() ? "hardware not recorded" : r->timing_setup];
      runs += (runs.empty() ? "" : ", ") + v.variant + " seed " + std::to_string(r->seed);
      ++n_other;
    }
    for (const RunRow* r : v.disturbed)
      train += (n_train++ ? ", " : "") + v.variant + " seed " + std::to_string(r->seed) + " (" +
               fixed(r->step_ms / v.fastest_step_ms, 1) + "×)";
    for (const RunRow* r : v.disturbed_eval)
      eval += (n_eval++ ? ", " : "") + v.variant + " seed " + std::to_string(r->seed) + " (" +
              fixed(v.fastest_eval_tps / r->eval_tps, 1) + "×)";
  }
  const auto runs = [](size_t n) { return std::to_string(n) + (n == 1 ? " run" : " runs"); };
  const std::string ratio = fixed(kDisturbedStepRatio, 0) + "×";
  std::string note;
  if (n_other) {
    note += "Speeds leave out " + runs(n_other) + " timed on other hardware than the rest: ";
    bool first = true;
    for (const auto& [setup, listed] : other) {
      note += (first ? "" : "; ") + listed + " (" + setup + ")";
      first = false;
    }
    note += ". ";
  }
  if (n_train)
    note += "Training speeds leave out " + runs(n_train) + " whose median step time was over " + ratio +
            " that of the fastest seed of the same variant on this task, most likely because other work shared the "
            "machine: " +
            train + ". ";
  if (n_eval)
    note += "Evaluation speeds leave out " + runs(n_eval) + " whose test scoring ran over " + ratio +
            " slower than the fastest seed's of the same variant: " + eval + ". ";
  if (!note.empty()) note += "Test metrics count every run.";
  return note;
}

void write_table(Pages& p, const Summary& s, const TaskSummary& t, const Table& table) {
  p.md << "## " << t.task << "\n\n";
  p.html << "<h2>" << html_escape(t.task) << "</h2>\n";
  write_grid(p, s, table);
  const std::string note = speed_note(t);
  if (note.empty()) return;
  p.md << note << "\n\n";
  p.html << "<p>" << html_escape(note) << "</p>\n";
}

void write_equal_time(Pages& p, const Summary& s, const EqualTimeTable& e) {
  const std::string text =
      "Validation quality after the same " + fixed(e.seconds, 1) + " s of training, when " + e.limited_by +
      "'s curve ends (its mean time to its last comparable validation). A run's training time at a validation is its "
      "step number times its variant's step time (the median of the variant's seeds' median step times, as the "
      "table's speeds take them); values are interpolated between validations, mean ± standard deviation over "
      "seeds.";
  p.md << "### " << e.task << " at equal training time\n\n" << text << "\n\n";
  p.html << "<h3>" << html_escape(e.task) << " at equal training time</h3>\n<p>" << html_escape(text) << "</p>\n";
  write_grid(p, s, e.table);
}

// The chart's <svg> element, inlined so that the HTML needs no other file.
std::string inline_svg(const std::string& file) {
  std::ifstream svg(file);
  std::string content((std::istreambuf_iterator<char>(svg)), {});
  const auto start = content.find("<svg");
  return start == std::string::npos ? "" : content.substr(start);
}

bool is_task_chart(const Chart& c, const std::string& task) { return c.title.rfind(task + ":", 0) == 0; }

// The task's charts, under its table.
void write_task_charts(Pages& p, const std::vector<Chart>& charts, const std::string& dir, const std::string& task) {
  for (const auto& c : charts) {
    if (!is_task_chart(c, task)) continue;
    p.md << "![" << c.title << "](" << c.file << ")\n\n*" << c.caption << "*\n\n";
    p.html << "<figure class=\"chart\">" << inline_svg(dir + "/" + c.file) << "<figcaption>" << html_escape(c.caption)
           << "</figcaption></figure>\n";
  }
}

// The charts of no single task, each under its own heading.
void write_other_charts(Pages& p, const std::vector<Chart>& charts, const std::string& dir,
                        const std::vector<std::pair<std::string, Table>>& tables) {
  for (const auto& c : charts) {
    bool per_task = false;
    for (const auto& [task, table] : tables) per_task |= is_task_chart(c, task);
    if (per_task) continue;
    p.md << "## " << c.title << "\n\n![" << c.title << "](" << c.file << ")\n\n*" << c.caption << "*\n\n";
    p.html << "<h2>" << html_escape(c.title) << "</h2>\n<figure class=\"chart\">" << inline_svg(dir + "/" + c.file)
           << "<figcaption>" << html_escape(c.caption) << "</figcaption></figure>\n";
  }
}

// How the claims table decides, stated once above it.
std::string claims_method(const ClaimsTable& t) {
  const bool equivalence =
      std::any_of(t.claims.begin(), t.claims.end(), [](const Claim& c) { return c.kind == "equivalent"; });
  const std::string level =
      t.tests == 0
          ? std::string("No row here has a spread to test, so no interval is adjusted.")
          : std::to_string(t.tests) + (t.tests == 1 ? " row has" : " rows have") +
                " a spread to test. Every interval shown is simultaneous: each at " + fixed(100 * t.confidence, 2) +
                "% (Bonferroni over " + std::to_string(t.tests) + (t.tests == 1 ? " test" : " tests") +
                "), so all of them hold together with 95% probability, and p-values are adjusted the "
                "same way (the export also gives each row's unadjusted 95% interval and Holm's p).";
  return "Each claim is tested on every task it is about, one row per task. A comparison is the difference of two "
         "variants' per-seed test metrics, paired by seed over the seeds both finished when there are " +
         std::to_string(kMinSeedsPerSide) +
         " of them, else Welch's t, with an effect size (d_z paired, Hedges' g unpaired). " + level +
         " A row is decided exactly when its interval is: a comparison when it excludes zero, a reduction when "
         "it lies inside or wholly outside the claim's tolerance band, a share (taken on the logit scale, so it "
         "stays within 0-100%) when it lies on one side of the threshold." +
         (equivalence && t.tests > 0
              ? " An equivalence (the two variants within the claim's margin) holds when two one-sided tests at "
                "the same adjusted level both reject (the narrower interval at " +
                    fixed(100 * (2 * t.confidence - 1), 2) +
                    "% lies inside the margin), and does not hold when the interval shown lies wholly outside "
                    "the margin; whether that interval holds zero does not decide it."
              : std::string()) +
         " Runs identical across seeds have no p-value and decide nothing, except FLOP counts, which are exact. "
         "Fewer than " +
         std::to_string(kMinSeedsPerSide) +
         " finished seeds on a side give no verdict, and no task drops out of a claim: it reads \"not enough "
         "seeds\", naming what it lacks. Over several tasks a claim holds (or does not) when every task says so, "
         "is task-dependent when some hold and some contradict it, partly decided when it is decided one way "
         "on some and open on the rest, and inconclusive when no task decides. \"vs paper\" is agrees or "
         "contradicts only where the interval excludes zero, else undecided. Only finished runs count; the "
         "runs left out are named. A row whose runs come from more than one code state (commit, uncommitted "
         "changes, or product library) gets no verdict, and says which" +
         std::string(t.mixed_code_allowed ? "; here they are judged all the same, as --allow-mixed-code asks."
                                          : " (chiar report --allow-mixed-code judges it anyway).");
}

const char* verdict_class(const std::string& verdict) {
  if (verdict == verdict::kHolds) return "holds";
  if (verdict == verdict::kDoesNotHold) return "fails";
  if (verdict == verdict::kTaskDependent || verdict == verdict::kPartlyDecided) return "mixed";
  return "unknown";
}

// One line of the claims table, in both formats.
void write_claim_row(Pages& p, const std::string& claim, const std::string& paper, const std::string& task,
                     const std::string& measured, const std::string& direction, const std::string& verdict,
                     bool headline) {
  const auto bold = [&](const std::string& x) {
    return headline && !x.empty() ? "**" + md_escape(x) + "**" : md_escape(x);
  };
  p.md << "| " << bold(claim) << " | " << md_escape(paper) << " | " << md_escape(task) << " | " << md_escape(measured)
       << " | " << direction << " | " << bold(verdict) << " |\n";
  const auto strong = [&](const std::string& x) {
    return headline && !x.empty() ? "<strong>" + html_escape(x) + "</strong>" : html_escape(x);
  };
  p.html << "<tr" << (headline ? " class=\"claim\"" : "") << "><td style=\"text-align:left\">" << strong(claim)
         << "</td><td>" << html_escape(paper) << "</td><td style=\"text-align:left\">" << html_escape(task)
         << "</td><td style=\"text-align:left\">" << html_escape(measured) << "</td><td>" << html_escape(direction)
         << "</td><td class=\"" << verdict_class(verdict) << "\">" << strong(verdict) << "</td></tr>\n";
}

void write_claims(Pages& p, const ClaimsTable& table) {
  const std::string how = claims_method(table) + (table.sequential.empty() ? "" : " " + table.sequential);
  p.md << "## The paper's claims against this database\n\n"
       << how << "\n\n| claim | paper | task | measured | vs paper | verdict |\n|---|---|---|---|---|---|\n";
  p.html << "<h2>The paper's claims against this database</h2>\n<p>" << html_escape(how)
         << "</p>\n<table class=\"claims\"><tr><th>claim</th><th>paper</th><th>task</th><th>measured</th>"
            "<th>vs paper</th><th>verdict</th></tr>\n";
  for (const auto& c : table.claims) {
    const auto row_text = [](const TaskTest& r) {
      return r.note.empty() ? r.measured : r.measured + " (" + r.note + ")";
    };
    if (c.tasks.empty()) {
      write_claim_row(p, c.claim, c.paper, "", c.measured, c.direction, c.verdict, true);
    } else if (c.tasks.size() == 1) {
      const TaskTest& r = c.tasks.front();
      const std::string verdict = c.detail.empty() ? c.verdict : c.verdict + ": " + c.detail;
      write_claim_row(p, c.claim, c.paper, r.label, row_text(r), r.direction, verdict, true);
    } else {
      const std::string verdict = c.detail.empty() ? c.verdict : c.verdict + ": " + c.detail;
      write_claim_row(p, c.claim, c.paper, "all " + std::to_string(c.tasks.size()) + " tasks", "", c.direction, verdict,
                      true);
      for (const auto& r : c.tasks) write_claim_row(p, "", "", r.label, row_text(r), r.direction, r.verdict, false);
    }
  }
  p.html << "</table>\n";
}

void write_problems(Pages& p, const Summary& s) {
  p.md << "\n## Runs that did not finish\n\n";
  p.html << "<h2>Runs that did not finish</h2>\n";
  if (s.problems.empty()) {
    p.md << "None: every run finished.\n";
    p.html << "<p>None: every run finished.</p>\n";
    return;
  }
  p.md << "| run | status | detail |\n|---|---|---|\n";
  p.html << "<table class=\"problems\"><tr><th>run</th><th>status</th><th>detail</th></tr>\n";
  for (const RunRow* r : s.problems) {
    std::string detail = r->error;
    if (r->diverged_step >= 0) detail = "diverged at step " + std::to_string(r->diverged_step) + ": " + detail;
    p.md << "| " << r->name << " | " << engine::to_string(r->status) << " | " << md_escape(detail) << " |\n";
    p.html << "<tr><td>" << html_escape(r->name) << "</td><td>" << engine::to_string(r->status)
           << "</td><td style=\"text-align:left\">" << html_escape(detail) << "</td></tr>\n";
  }
  p.html << "</table>\n";
}

// What the finished runs cost, from the store (the span of dates above it
// includes the time between sittings).
std::string training_time(const Provenance& p) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2) << p.training_hours << " h of training over " << p.finished_runs
      << (p.finished_runs == 1 ? " finished run" : " finished runs")
      << " (each run's training loop with its validations, summed; test scoring and work lost to interruptions "
         "not counted)";
  return out.str();
}

// The hardware the report's speeds were timed on.
std::string timing(const Summary& s) {
  if (s.timing_setup.empty()) return "";
  return "; speeds timed on " + s.timing_setup + " (" + std::to_string(s.runs_on_timing_setup) + " of " +
         std::to_string(s.provenance.finished_runs) + " finished runs)";
}

void write_provenance(Pages& pages, const Summary& s) {
  const Provenance& p = s.provenance;
  const bool one_commit = p.commits.find("; ") == std::string::npos;
  const std::string footer = (one_commit ? "harness commit " : "harness commits ") + p.commits + "; libtorch " +
                             p.torch + "; BLAS " + p.blas + "; products on " + p.gemm + "; threads " + p.threads +
                             "; allocator " + p.allocators + "; hosts " + p.hosts + " (" + p.cpus + "); devices " +
                             p.devices + timing(s) + "; runs from " + p.first + " to " + p.last + "; " +
                             training_time(p) + "; matrix " + p.matrices + ".";
  pages.md << "\n---\n\nProvenance: " << footer << "\n";
  pages.html << "<footer>Provenance: " << html_escape(footer) << "</footer>\n</body></html>\n";
}

// Whether every finished run of the task scored the same word and token
// perplexity (to 1e-9 relative).
bool word_ppl_repeats_token_ppl(const TaskSummary& t) {
  for (const auto& v : t.variants)
    for (const RunRow* r : v.runs) {
      const auto token = r->test_best.find("token_ppl"), word = r->test_best.find("word_ppl");
      if (token == r->test_best.end() || word == r->test_best.end()) continue;
      if (std::abs(word->second - token->second) > 1e-9 * std::abs(token->second)) return false;
    }
  return true;
}

// A metric column: its heading, the metric's key, the scale and digits it is
// shown with, and whether variants are ranked on it.
struct MetricColumn {
  std::string name, key;
  double scale;
  int digits;
  bool ranked;
};

std::vector<MetricColumn> metric_columns(const TaskSummary& t) {
  if (!t.language_model)  // the test split's majority class: the rate a model must beat to have learned anything
    return {{"accuracy %", "accuracy", 100, 2, true}, {"majority class %", "majority_rate", 100, 2, false}};
  std::vector<MetricColumn> cols = {{"token PPL", "token_ppl", 1, 2, true}};
  // On a word-level vocabulary a token is a word, and the word perplexity
  // repeats the token perplexity: shown only where it differs.
  if (!word_ppl_repeats_token_ppl(t)) cols.push_back({"word PPL", "word_ppl", 1, 2, true});
  cols.push_back({"bits/byte", "bits_per_byte", 1, 4, true});
  return cols;
}

// One variant's row of a task table: each cell with the value it is ranked
// by (NaN: not ranked) and whether lower wins in its column.
struct RankedRow {
  std::vector<std::string> cells;
  std::vector<double> values;
  std::vector<bool> lower;
  void add(std::string cell, double value = NAN, bool lower_wins = false) {
    cells.push_back(std::move(cell));
    values.push_back(value);
    lower.push_back(lower_wins);
  }
};

RankedRow variant_row(const VariantSummary& v, const VariantSummary* base, const std::vector<MetricColumn>& cols,
                      bool on_gpu) {
  RankedRow r;
  r.add(v.variant);
  r.add(std::to_string(v.runs.size()));
  for (const auto& c : cols) {
    auto it = v.metric.find(c.key);
    // An unranked column describes the split, not the runs: no spread.
    r.add(it == v.metric.end() ? ""
          : c.ranked           ? with_spread(it->second, c.scale, c.digits)
                               : fixed(it->second.mean * c.scale, c.digits),
          it == v.metric.end() || !c.ranked ? NAN : it->second.mean, lower_is_better(c.key));
  }
  r.add(fixed(v.attn_gflops.mean, 5), v.attn_gflops.mean, true);
  const bool has_base = base && base->attn_gflops.mean > 0;
  r.add(has_base && &v != base ? fixed(100.0 * (v.attn_gflops.mean / base->attn_gflops.mean - 1.0), 1) + "%" : "");
  r.add(fixed(v.total_gflops.mean, 5) + " / " + fixed(v.total_sparse_gflops.mean, 5), v.total_gflops.mean, true);
  // A variant none of whose runs on the task was timed on the report's
  // timing setup has no speed here: blank, not 0.
  const bool trained = v.train_tps.n > 0, scored = v.eval_tps.n > 0;
  r.add(trained ? fixed(v.train_tps.mean, 0) : "", trained ? v.train_tps.mean : NAN);
  r.add(trained && base && &v != base && base->train_tps.mean > 0
            ? fixed(v.train_tps.mean / base->train_tps.mean, 2) + "×"
            : "");
  r.add(scored ? fixed(v.eval_tps.mean, 0) : "", scored ? v.eval_tps.mean : NAN);
  r.add(std::to_string(v.params));
  if (on_gpu) {
    const bool has = v.gpu_allocated_mb.n > 0;
    r.add(has ? fixed(v.gpu_allocated_mb.mean, 0) + " / " + fixed(v.gpu_reserved_mb.mean, 0) : "",
          has ? v.gpu_allocated_mb.mean : NAN, true);
  }
  r.add("best valid");
  return r;
}

Table task_table(const TaskSummary& t, const std::string& baseline) {
  const VariantSummary* base = nullptr;
  for (const auto& v : t.variants)
    if (v.variant == baseline) base = &v;
  const auto cols = metric_columns(t);
  Table table;
  table.header = {"variant", "seeds"};
  for (const auto& c : cols) table.header.push_back(c.name);
  for (const char* h : {"attn GFLOPs", "attn vs base", "total GFLOPs exec / sparse", "train tok/s", "speed-up",
                        "eval tok/s", "params", "scored"})
    table.header.push_back(h);
  // Where runs trained on a GPU: its caching allocator's peaks (MiB, mean
  // over those runs), ranked by what was allocated.
  const bool on_gpu = std::any_of(t.variants.begin(), t.variants.end(),
                                  [](const VariantSummary& v) { return v.gpu_allocated_mb.n > 0; });
  if (on_gpu) table.header.insert(table.header.end() - 1, "peak GPU MiB alloc / reserved");
  // Per column: the values to rank (NaN = not ranked) and whether lower wins.
  std::vector<std::vector<double>> rank(table.header.size());
  std::vector<bool> lower(table.header.size(), false);
  for (const auto& v : t.variants) {
    RankedRow r = variant_row(v, base, cols, on_gpu);
    for (size_t c = 0; c < r.values.size(); ++c) rank[c].push_back(r.values[c]);
    lower = r.lower;
    table.rows.push_back(std::move(r.cells));
  }
  mark_best(table, rank, lower);
  return table;
}

}  // namespace

std::vector<std::pair<std::string, Table>> task_tables(const Summary& s, const std::string& baseline) {
  std::vector<std::pair<std::string, Table>> out;
  for (const auto& t : s.tasks) out.emplace_back(t.task, task_table(t, baseline));
  return out;
}

ReportFiles write_report(const std::string& db, const std::string& out, const std::string& baseline,
                         const std::string& claims_file, const PluginRegistry& registry, const std::string& source,
                         bool allow_mixed_code) {
  const auto claim_specs = load_claims(claims_file);
  const Summary s = summarize(db, OperatorCatalog(registry));
  const boost::filesystem::path base(out);
  const std::string dir = base.parent_path().empty() ? "." : base.parent_path().string();
  const std::string prefix = base.filename().string();
  // Only a missing folder is made: Boost 1.74's create_directories refuses
  // "." and "..".
  if (!boost::filesystem::is_directory(dir)) boost::filesystem::create_directories(dir);
  // Refused before the charts, whose scripts gnuplot would fail to read.
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw EnvironmentError(dir + ": cannot write the report there: " + std::strerror(errno));
  const auto charts = draw_charts(s, dir, prefix, baseline);
  const auto tables = task_tables(s, baseline);
  const auto sequential = read_sequential_looks(db);
  const auto claims =
      evaluate_claims(claim_specs, s, baseline, {sequential ? &*sequential : nullptr, allow_mixed_code});
  const auto equal_time = equal_time_tables(s);

  Pages pages;
  write_intro(pages, "Results: " + s.provenance.matrices, source.empty() ? db : source, baseline);
  for (size_t i = 0; i < tables.size(); ++i) {
    const auto& [task, table] = tables[i];
    write_table(pages, s, s.tasks[i], table);
    for (const auto& e : equal_time)
      if (e.task == task) write_equal_time(pages, s, e);
    write_task_charts(pages, charts, dir, task);
  }
  write_other_charts(pages, charts, dir, tables);
  write_claims(pages, claims);
  write_problems(pages, s);
  write_provenance(pages, s);

  ReportFiles files{out + ".md", out + ".html", out + "-claims.csv", out + "-claims.json", {}};
  // A full disk or a read-only folder is the environment's failure (exit 3), not a report.
  const auto write = [](const std::string& file, const std::function<void(std::ostream&)>& body) {
    std::ofstream out(file);
    if (out) body(out);
    if (!out || !out.flush()) throw EnvironmentError(file + ": cannot write the report: " + std::strerror(errno));
  };
  write(files.markdown, [&](std::ostream& o) { o << pages.md.str(); });
  write(files.html, [&](std::ostream& o) { o << pages.html.str(); });
  write(files.claims_csv, [&](std::ostream& o) { write_claims_csv(claims, o); });
  write(files.claims_json, [&](std::ostream& o) { write_claims_json(claims, o); });
  for (const auto& c : charts) files.images.push_back(dir + "/" + c.file);
  return files;
}

}  // namespace chiar::report
