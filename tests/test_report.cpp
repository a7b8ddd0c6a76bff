#include <catch2/catch.hpp>

#include <array>
#include <cstdio>
#include <fstream>

#include <boost/filesystem.hpp>

#include "engine/store.h"
#include "report/claims.h"
#include "report/report.h"
#include "support/fixtures.h"
#include "support/temp_dir.h"

using namespace chiar;
using test::TempDir;

namespace {

const std::string kClaims = std::string(CHIAR_SOURCE_DIR) + "/configs/claims.toml";

report::Summary summary_of(const std::string& db) {
  return report::summarize(db, report::OperatorCatalog(test::plugins()));
}

engine::RunSpec spec(const std::string& variant, const std::string& task, int64_t seed) {
  engine::RunSpec r;
  r.matrix = "fixture";
  r.variant = variant;
  r.task = task;
  r.seed = seed;
  r.canonical = variant + task + std::to_string(seed);
  r.hash = "h" + std::to_string(std::hash<std::string>{}(r.canonical) % 1000000007);
  return r;
}

// A store with known numbers: 3 seeds per variant on an LM task, 2 on a
// classification task, one failed and one diverged run.
std::string make_store(const TempDir& d) {
  const std::string db = d.path() + "/fixture.db";
  engine::Store store(db);
  std::vector<engine::RunSpec> runs;
  for (const char* v : {"baseline", "chiar_dct_attn", "chiar_hard", "chiar_soft"})
    for (int seed = 0; seed < 3; ++seed) runs.push_back(spec(v, "wikitext103", seed));
  for (const char* v : {"baseline", "chiar_dct_attn"})
    for (int seed = 0; seed < 2; ++seed) runs.push_back(spec(v, "listops_flat", seed));
  runs.push_back(spec("chiar_soft", "listops_flat", 0));
  runs.push_back(spec("chiar_hard", "listops_flat", 0));
  store.register_runs(runs);
  engine::Provenance p;
  p.host = "fixture-host";
  p.git_commit = "abc123";
  p.torch_version = "1.13";
  for (const auto& r : runs) {
    store.claim(r, p);
    if (r.task == "listops_flat" && r.variant == "chiar_soft") {
      store.finish(r.hash, engine::RunStatus::Failed, "out of memory", -1, {});
      continue;
    }
    if (r.task == "listops_flat" && r.variant == "chiar_hard") {
      store.finish(r.hash, engine::RunStatus::Diverged, "loss nan at step 7", 7, {});
      continue;
    }
    const double s = static_cast<double>(r.seed);
    engine::RunSummary sum;
    sum.params = 1000;
    sum.train_tokens_per_s = r.variant == "baseline" ? 100 : 150;
    sum.eval_tokens_per_s = 300;
    sum.tau = "{}";
    if (r.task == "wikitext103") {
      // baseline perplexity 60, 62, 64; DCT+Attn 30, 32, 34; hard 40..; soft 50..
      const double base = r.variant == "baseline" ? 60 : r.variant == "chiar_dct_attn" ? 30 : r.variant == "chiar_hard" ? 40 : 50;
      store.add_metrics(r.hash, 10, "test", "best", {{"token_ppl", base + 2 * s}, {"word_ppl", base + 2 * s}, {"bits_per_byte", 1.0}});
      store.add_metrics(r.hash, 10, "test", "last", {{"token_ppl", base + 2 * s + 1}});
    } else {
      store.add_metrics(r.hash, 10, "test", "best", {{"accuracy", r.variant == "baseline" ? 0.9 + 0.02 * s : 0.6}});
    }
    // Attention 8 GFLOPs per sequence for the baseline, 3 for DCT+Attn (-62.5%).
    const double attn = r.variant == "baseline" ? 8e9 : 3e9;
    store.add_flops(r.hash, 10, {{1, "attention", 64, attn, attn, 3 * attn, 3 * attn}, {1, "ffn", 64, 2e9, 2e9, 6e9, 6e9}}, 5e9);
    if (r.variant == "chiar_hard") store.add_routing(r.hash, 10, 1, {{"dct", 0.6}, {"rbf", 0.02}, {"attention", 0.38}}, std::vector<int64_t>(20, 1));
    store.finish(r.hash, engine::RunStatus::Done, "", -1, sum);
  }
  return db;
}

}  // namespace

TEST_CASE("report tables: means, standard deviations, 95% CIs, best marks", "[report]") {
  TempDir d("report");
  const auto s = summary_of(make_store(d));
  const auto tables = report::task_tables(s, "baseline");
  REQUIRE(tables.size() == 2);
  const auto& lm = tables[0].second;
  CHECK(tables[0].first == "wikitext103");
  CHECK(lm.header[2] == "token PPL");
  // 60, 62, 64: mean 62, sample std 2, CI t(0.975, 2) * 2 / sqrt(3) = 4.303 * 1.1547 = 4.97.
  CHECK(lm.rows[0][2] == "62.00 ± 2.00 (95% CI ± 4.97)");
  CHECK(lm.rows[1][2] == "32.00 ± 2.00 (95% CI ± 4.97)");
  CHECK(lm.best[1][2]);   // lowest perplexity
  CHECK_FALSE(lm.best[0][2]);
  CHECK(lm.rows[1][5] == "3.00000");  // attention GFLOPs
  CHECK(lm.rows[1][6] == "-62.5%");
  CHECK(lm.rows[1][9] == "1.50×");
  const auto& cls = tables[1].second;
  CHECK(cls.rows.size() == 2);                    // failed and diverged runs are not averaged in
  CHECK(cls.rows[0][2] == "91.00 ± 1.41");        // 90 and 92: two seeds, no CI
  CHECK(cls.best[0][2]);
  REQUIRE(s.problems.size() == 2);
  CHECK(s.problems[0]->status == engine::RunStatus::Failed);
  CHECK(s.problems[1]->diverged_step == 7);
  const auto st = report::stat_of({1, 2, 3, 4});
  CHECK(st.mean == Approx(2.5));
  CHECK(st.std == Approx(1.2909944));
  CHECK(st.ci95 == Approx(3.182 * 1.2909944 / 2));
}

TEST_CASE("report claims: verdicts from the numbers", "[report]") {
  TempDir d("claims");
  const std::string db = make_store(d);
  const auto claims = report::evaluate_claims(report::load_claims(kClaims), summary_of(db), "baseline");
  std::map<std::string, std::string> verdict;
  for (const auto& c : claims) verdict[c.claim.substr(0, 20)] = c.verdict;
  CHECK(verdict["WikiText-103: DCT+At"] == "holds");                  // 32 < 62
  CHECK(verdict["WikiText-2: full att"] == "not enough runs");
  CHECK(verdict["Flat ListOps: full a"] == "holds");                  // 91% > 60%
  CHECK(verdict["DCT+Attn cuts attent"] == "holds");                  // exactly -62.5%
  CHECK(verdict["Hard (STE) routing b"] == "holds");                  // 42 < 52
  CHECK(verdict["Routing collapse: th"] == "holds");                  // RBF 2%
  CHECK(claims[4].measured.find("62.5%") != std::string::npos);
  // The same sentences the claims produced when they were written in C++.
  CHECK(claims[0].measured == "wikitext103: chiar_dct_attn 32.00 vs baseline 62.00 (3 and 3 seeds)");
  CHECK(claims[0].paper == "36.54 vs 66.62");
  CHECK(claims[1].measured == "needs baseline and chiar_dct_attn on task wikitext2");
  CHECK(claims[3].measured == "listops_flat: baseline 91.00% vs chiar_dct_attn 60.00% (2 and 2 seeds)");
  CHECK(claims[4].measured ==
        "wikitext103: 62.5% (8.0000 -> 3.0000 GFLOPs per sequence); listops_flat: 62.5% (8.0000 -> 3.0000 GFLOPs per sequence)");
  CHECK(claims[5].measured == "wikitext103: chiar_hard 42.00 vs chiar_soft 52.00 (3 and 3 seeds)");
  CHECK(claims[6].verdict == "holds");  // 32 < 42 on the one task both finished
  CHECK(claims[7].measured == "mean RBF share in routed layers at the end of training: 2.0% over 3 runs");
  // --baseline moves every "$baseline" of the file.
  const auto other = report::evaluate_claims(report::load_claims(kClaims), summary_of(db), "chiar_soft");
  CHECK(other[0].measured == "wikitext103: chiar_dct_attn 32.00 vs chiar_soft 52.00 (3 and 3 seeds)");
}

TEST_CASE("report files: Markdown with charts beside it, HTML that renders offline", "[report][html]") {
  TempDir d("report-files");
  const std::string db = make_store(d);
  const auto files = report::write_report(db, d.path() + "/out/fixture", "baseline", kClaims, test::plugins());
  CHECK(boost::filesystem::exists(files.markdown));
  CHECK(files.images.size() >= 4);
  for (const auto& image : files.images) CHECK(boost::filesystem::file_size(image) > 500);
  std::ifstream md(files.markdown);
  const std::string text((std::istreambuf_iterator<char>(md)), {});
  CHECK_THAT(text, Catch::Matchers::Contains("| chiar_hard/listops_flat/seed=0 | diverged | diverged at step 7: loss nan at step 7 |"));
  CHECK_THAT(text, Catch::Matchers::Contains("](fixture-pareto-wikitext103.svg)"));
  CHECK_THAT(text, Catch::Matchers::Contains("Provenance: harness commit abc123"));
  std::ifstream html_in(files.html);
  const std::string html((std::istreambuf_iterator<char>(html_in)), {});
  CHECK(html.find("http://") == html.find("http://www.w3.org"));  // only SVG namespaces, no fetches
  CHECK(html.find("<script") == std::string::npos);

  // Headless Chromium: the page renders, every chart is in the DOM, no console errors.
  const std::string profile = d.path() + "/chromium-profile";
  const std::string shot = std::string(CHIAR_BINARY_DIR) + "/test-artifacts/report.png";
  boost::filesystem::create_directories(boost::filesystem::path(shot).parent_path());
  const std::string flags = "--headless --no-sandbox --disable-gpu --user-data-dir=" + profile +
                            " --enable-logging=stderr --v=0 --window-size=1280,6000 ";
  auto capture = [](const std::string& cmd) {
    std::string out;
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    std::array<char, 4096> buf{};
    while (p && fgets(buf.data(), buf.size(), p)) out += buf.data();
    if (p) pclose(p);
    return out;
  };
  const std::string dom = capture("chromium " + flags + "--dump-dom file://" + files.html);
  size_t svgs = 0;
  for (size_t at = dom.find("<svg"); at != std::string::npos; at = dom.find("<svg", at + 1)) ++svgs;
  CHECK(svgs == files.images.size());
  CHECK(dom.find("CONSOLE") == std::string::npos);
  CHECK(dom.find("Uncaught") == std::string::npos);
  capture("chromium " + flags + "--screenshot=" + shot + " file://" + files.html);
  CHECK(boost::filesystem::exists(shot));
}
