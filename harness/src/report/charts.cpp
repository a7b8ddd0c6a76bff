#include "charts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <boost/filesystem.hpp>

#include "engine/store/results.h"
#include "chiar/error.h"

namespace chiar::report {
namespace {

// Okabe-Ito: distinguishable with colour-blindness and in greyscale print.
const char* const kPalette[] = {"#000000", "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442"};

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

const char* kHeader =
    "set terminal svg size 760,460 dynamic noenhanced font 'Helvetica,12' background rgb 'white'\n"
    "set grid lc rgb '#dddddd'\nset key outside right top box lc rgb '#bbbbbb'\nset border lc rgb '#444444'\n";

void run_gnuplot(const std::string& script_path) {
  const std::string command = "gnuplot " + quote(script_path) + " 2>&1";
  FILE* p = popen(command.c_str(), "r");
  std::string out;
  char buf[256];
  while (p && fgets(buf, sizeof buf, p)) out += buf;
  const int rc = p ? pclose(p) : -1;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  if (rc != 0) throw EnvironmentError("gnuplot failed on " + script_path + ": " + out);
}

std::vector<double> numbers_after(const std::string& json, const std::string& key) {
  std::vector<double> out;
  const auto at = json.find("\"" + key + "\"");
  if (at == std::string::npos) return out;
  const auto open = json.find('[', at), close = json.find(']', at);
  std::stringstream items(json.substr(open + 1, close - open - 1));
  std::string item;
  while (std::getline(items, item, ','))
    if (!item.empty()) out.push_back(std::atof(item.c_str()));
  return out;
}

// "a", "a and b", "a, b and c".
std::string listed(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i == 0 ? "" : i + 1 == items.size() ? " and " : ", ") + items[i];
  return out;
}

}  // namespace

OperatorPoint operator_point(const OperatorCatalog& operators, const std::string& op) {
  // gnuplot's svg point types, filled shapes first.
  static const OperatorPoint kPoints[] = {{7, "circles"},         {5, "squares"},        {9, "triangles"},
                                          {11, "down triangles"}, {13, "diamonds"},      {6, "open circles"},
                                          {4, "open squares"},    {8, "open triangles"}, {10, "open down triangles"},
                                          {12, "open diamonds"}};
  return kPoints[operators.order(op) % (sizeof kPoints / sizeof *kPoints)];
}

std::string variant_colour(const Summary& s, const std::string& variant) {
  const auto it = std::find(s.variant_order.begin(), s.variant_order.end(), variant);
  const size_t i = static_cast<size_t>(it - s.variant_order.begin());
  return kPalette[i % (sizeof kPalette / sizeof *kPalette)];
}

namespace {

constexpr size_t kPaletteSize = sizeof kPalette / sizeof *kPalette;

// The variants a chart that draws lines per variant shows for one task. Past
// the palette's size colours repeat and a legend of hundreds of entries reads
// as nothing, and gnuplot's time grows with every line (a 10,000-run sweep:
// chiar_store_scale): a task with more variants shows the baseline and the
// best others by their mean test metric. The tables list every variant.
struct ShownVariants {
  std::vector<const VariantSummary*> variants;
  size_t of = 0;  // the task's variants
  bool all() const { return variants.size() == of; }
  // Colours are the report's own while every variant is shown, else by place here.
  std::string colour(const Summary& s, const std::string& variant) const {
    if (all()) return variant_colour(s, variant);
    for (size_t i = 0; i < variants.size(); ++i)
      if (variants[i]->variant == variant) return kPalette[i % kPaletteSize];
    return kPalette[0];
  }
  // What a caption says of the choice; empty when every variant is shown.
  std::string note(const TaskSummary& t) const {
    if (all()) return "";
    return " It shows " + std::to_string(variants.size()) + " of the task's " + std::to_string(of) +
           " variants: the baseline and the best by mean test " + (t.language_model ? "perplexity" : "accuracy") +
           "; the tables list them all.";
  }
};

ShownVariants shown_variants(const TaskSummary& t, const std::string& baseline) {
  ShownVariants shown;
  shown.of = t.variants.size();
  for (const auto& v : t.variants) shown.variants.push_back(&v);
  if (shown.variants.size() <= kPaletteSize) return shown;
  const std::string metric = t.language_model ? "token_ppl" : "accuracy";
  const auto score = [&](const VariantSummary* v) {
    const auto it = v->metric.find(metric);
    if (it == v->metric.end() || it->second.n == 0) return -HUGE_VAL;
    return t.language_model ? -it->second.mean : it->second.mean;
  };
  std::stable_sort(shown.variants.begin(), shown.variants.end(), [&](const VariantSummary* a, const VariantSummary* b) {
    if ((a->variant == baseline) != (b->variant == baseline)) return a->variant == baseline;
    return score(a) > score(b);
  });
  shown.variants.resize(kPaletteSize);
  return shown;
}

// Where one report's charts go: names, paths, the store, the charts made.
struct ChartSite {
  const Summary& s;
  engine::ResultsReader& store;
  const std::string& out_dir;
  const std::string& prefix;
  std::vector<Chart>& charts;

  std::string file(const std::string& what) const { return prefix + "-" + what + ".svg"; }
  std::string path(const std::string& name) const { return out_dir + "/" + name; }

  // Writes NAME.gp (the shared header, the output file, then `script`), runs
  // gnuplot on it and records the chart. The data file must be closed.
  void render(const std::string& name, const std::string& script, Chart chart) const {
    const std::string gp = path(name + ".gp");
    std::ofstream g(gp);
    g << kHeader << "set output " << quote(path(name)) << script;
    g.close();
    if (!g) throw EnvironmentError(gp + ": cannot write the file: " + std::strerror(errno));
    run_gnuplot(gp);
    charts.push_back(std::move(chart));
  }
};

// Metric against FLOPs, one point per run.
void pareto_chart(const ChartSite& site, const TaskSummary& t) {
  const std::string metric = t.language_model ? "token_ppl" : "accuracy";
  const std::string ylabel = t.language_model ? "test perplexity (per token)" : "test accuracy (%)";
  const double scale = t.language_model ? 1.0 : 100.0;
  const std::string name = site.file("pareto-" + t.task), data = site.path(name + ".dat");
  std::ofstream d(data);
  int points = 0, block = 0;
  std::ostringstream plot;
  for (const auto& v : t.variants) {
    for (const RunRow* r : v.runs)
      if (r->test_best.count(metric)) {
        d << r->total_fwd / 1e9 << ' ' << r->test_best.at(metric) * scale << '\n';
        ++points;
      }
    d << "\n\n";
    const int index = block++;
    plot << (index ? ", " : "") << quote(data) << " index " << index << " with points pt 7 ps 1.3 lc rgb '"
         << variant_colour(site.s, v.variant) << "' title " << quote(v.variant);
  }
  d.close();
  if (points == 0) return;
  site.render(name,
              "\nset title " + quote(t.task + ": quality against compute") +
                  "\nset xlabel 'forward GFLOPs per sequence (executed)'\nset ylabel " + quote(ylabel) + "\nplot " +
                  plot.str() + "\n",
              {t.task + ": quality against compute", name,
               "One point per run; lower-left is better for perplexity, upper-left for accuracy."});
}

// Validation loss per evaluation of one run: the stored loss, or nll / tokens.
std::map<int64_t, double> validation_losses(engine::ResultsReader& store, int64_t run_id) {
  const auto by_step = store.validation_metrics(run_id, {"nll", "tokens", "loss"});
  std::map<int64_t, double> out;
  for (const auto& [step, m] : by_step)  // a validation with neither is not drawn
    if (m.count("loss"))
      out[step] = m.at("loss");
    else if (m.count("nll") && m.count("tokens"))
      out[step] = m.at("nll") / std::max(1.0, m.at("tokens"));
  return out;
}

// Training loss (lines) and validation loss (circles) over steps.
void curves_chart(const ChartSite& site, const TaskSummary& t, const ShownVariants& shown) {
  const std::string name = site.file("curves-" + t.task), data = site.path(name + ".dat");
  std::ofstream d(data);
  int points = 0, block = 0;
  std::ostringstream plot;
  for (const VariantSummary* shown_variant : shown.variants) {
    const VariantSummary& v = *shown_variant;
    const std::string colour = shown.colour(site.s, v.variant);
    bool titled = false;
    for (const RunRow* r : v.runs) {
      for (const auto& [step, loss] : site.store.train_losses(r->id)) {
        d << step << ' ' << loss << '\n';
        ++points;
      }
      d << "\n\n";
      const int index = block++;
      plot << (index ? ", " : "") << quote(data) << " index " << index << " with lines lw 1.5 lc rgb '" << colour
           << "' " << (titled ? "notitle" : "title " + quote(v.variant));
      titled = true;
      for (const auto& [step, loss] : validation_losses(site.store, r->id)) d << step << ' ' << loss << '\n';
      d << "\n\n";
      const int val_index = block++;
      plot << ", " << quote(data) << " index " << val_index << " with points pt 6 ps 1.1 lc rgb '" << colour
           << "' notitle";
    }
  }
  d.close();
  if (points == 0) return;
  site.render(name,
              "\nset title " + quote(t.task + ": training (lines) and validation (circles) loss") +
                  "\nset xlabel 'step'\nset ylabel 'loss (nats per token or example)'\nplot " + plot.str() + "\n",
              {t.task + ": learning curves", name,
               "Training loss of every run (lines) and validation loss (circles)." + shown.note(t)});
}

// The routing chart's caption: the plotted operators with their point shapes,
// and the cheap ones that take the rest, in registry order.
std::string routing_caption(const Summary& s, std::vector<std::string> plotted, std::vector<std::string> cheap) {
  const auto by_order = [&](const std::string& a, const std::string& b) {
    return s.operators.order(a) != s.operators.order(b) ? s.operators.order(a) < s.operators.order(b) : a < b;
  };
  std::sort(plotted.begin(), plotted.end(), by_order);
  std::sort(cheap.begin(), cheap.end(), by_order);
  std::vector<std::string> shown, rest;
  for (const auto& op : plotted)
    shown.push_back(s.operators.traits(op).display_name + " (" + operator_point(s.operators, op).shape + ")");
  for (const auto& op : cheap) rest.push_back(s.operators.traits(op).display_name);
  return "Share of tokens sent to " + listed(shown) + " per routed layer (L2, L4, ... solid; L3, L5, ... dashed)" +
         (rest.empty() ? std::string() : "; the rest go to " + listed(rest)) +
         ". A share falling to 0 is routing collapse.";
}

// Operator shares per routed layer over training (first seed of each routed
// variant): every operator but the cheap ones, which take the rest.
void routing_chart(const ChartSite& site, const TaskSummary& t, const ShownVariants& shown) {
  const std::string name = site.file("routing-" + t.task), data = site.path(name + ".dat");
  std::ofstream d(data);
  std::ostringstream plot;
  int block = 0;
  std::vector<std::string> plotted, cheap;
  for (const VariantSummary* shown_variant : shown.variants) {
    const VariantSummary& v = *shown_variant;
    if (v.runs.empty()) continue;
    const RunRow* r = v.runs.front();
    for (const auto& series : site.store.routing(r->id)) {
      const int64_t layer = series.layer;
      const std::string& op = series.op;
      const OperatorTraits traits = site.s.operators.traits(op);
      if (traits.role == OperatorRole::CheapMixing) {
        if (std::find(cheap.begin(), cheap.end(), op) == cheap.end()) cheap.push_back(op);
        continue;
      }
      if (std::find(plotted.begin(), plotted.end(), op) == plotted.end()) plotted.push_back(op);
      for (const auto& [step, share] : series.shares) d << step << ' ' << 100 * share << '\n';
      d << "\n\n";
      const int index = block++;
      plot << (index ? ", " : "") << quote(data) << " index " << index << " with linespoints lw 1.5 pt "
           << operator_point(site.s.operators, op).type << " dt " << (layer % 2 ? 1 : 2) << " lc rgb '"
           << shown.colour(site.s, v.variant) << "' title "
           << quote(v.variant + " L" + std::to_string(layer + 1) + " " + traits.display_name);
    }
  }
  d.close();
  if (block == 0) return;
  site.render(name,
              "\nset title " + quote(t.task + ": operator share per routed layer") +
                  "\nset xlabel 'step'\nset ylabel 'share of tokens (%)'\nset yrange [0:100]\nplot " + plot.str() +
                  "\n",
              {t.task + ": routing over training", name, routing_caption(site.s, plotted, cheap) + shown.note(t)});
}

// The first run with data-derived thresholds: tau holds a bracket with a digit.
const RunRow* first_calibrated_run(const VariantSummary& v) {
  if (v.runs.empty() || v.runs.front()->tau.find('[') == std::string::npos) return nullptr;
  const RunRow* r = v.runs.front();
  for (char c : r->tau.substr(r->tau.find('[')))
    if (c >= '0' && c <= '9') return r;
  return nullptr;
}

// Spectral entropy histograms with the thresholds in force (first variant
// with thresholds).
void entropy_chart(const ChartSite& site, const TaskSummary& t) {
  for (const auto& v : t.variants) {
    const RunRow* r = first_calibrated_run(v);
    if (!r) continue;
    const std::string name = site.file("entropy-" + t.task), data = site.path(name + ".dat");
    std::ofstream d(data);
    std::ostringstream plot, arrows;
    int block = 0;
    for (const auto& histogram : site.store.last_histograms(r->id)) {
      const int64_t layer = histogram.layer;
      for (const auto& bin : histogram.bins) d << (bin.lo + bin.hi) / 2 << ' ' << bin.count << '\n';
      d << "\n\n";
      const char* colour = kPalette[(block + 1) % 7];
      const int index = block++;
      plot << (index ? ", " : "") << quote(data) << " index " << index << " with histeps lw 2 lc rgb '" << colour
           << "' title " << quote("layer " + std::to_string(layer + 1));
      for (double tau : numbers_after(r->tau, "layer" + std::to_string(layer + 1)))
        arrows << "set arrow from " << tau << ", graph 0 to " << tau << ", graph 1 nohead dt 2 lw 1.5 lc rgb '"
               << colour << "'\n";
    }
    d.close();
    site.render(name,
                "\nset title " + quote(t.task + ", " + v.variant + ": spectral entropy of routed-layer inputs") +
                    "\nset xlabel 'spectral entropy H'\nset ylabel 'tokens'\nset xrange [0:1]\n" + arrows.str() +
                    "plot " + plot.str() + "\n",
                {t.task + ": spectral entropy and thresholds", name,
                 "Histogram of H at the last evaluation (" + v.variant + ", seed " + std::to_string(r->seed) +
                     "); dashed lines are the thresholds tau in force."});
    return;
  }
}

// Measured training speed-up against training-FLOP reduction, every task.
void speedup_chart(const ChartSite& site, const std::string& baseline) {
  const Summary& s = site.s;
  const std::string name = site.file("speedup"), data = site.path(name + ".dat");
  std::ofstream d(data);
  std::ostringstream plot;
  int block = 0, points = 0;
  double top = 1.5;
  std::vector<std::map<std::string, const VariantSummary*>> by_name(s.tasks.size());  // per task
  for (size_t i = 0; i < s.tasks.size(); ++i)
    for (const auto& x : s.tasks[i].variants) by_name[i][x.variant] = &x;
  const auto find = [&](size_t task, const std::string& variant) -> const VariantSummary* {
    const auto it = by_name[task].find(variant);
    return it == by_name[task].end() ? nullptr : it->second;
  };
  for (const auto& variant : s.variant_order) {
    if (variant == baseline) continue;
    bool any = false;
    for (size_t i = 0; i < s.tasks.size(); ++i) {
      const auto& t = s.tasks[i];
      const VariantSummary *b = find(i, baseline), *v = find(i, variant);
      if (!b || !v || v->runs.empty() || b->runs.empty()) continue;
      double bf = 0, vf = 0;
      for (const RunRow* r : b->runs) bf += r->total_train / static_cast<double>(b->runs.size());
      for (const RunRow* r : v->runs) vf += r->total_train / static_cast<double>(v->runs.size());
      if (vf <= 0 || b->train_tps.mean <= 0 || v->train_tps.n == 0) continue;
      const double x = bf / vf, y = v->train_tps.mean / b->train_tps.mean;
      top = std::max({top, x * 1.1, y * 1.1});
      d << x << ' ' << y << " \"" << t.task << "\"\n";
      any = true;
      ++points;
    }
    d << "\n\n";
    if (any)
      plot << ", " << quote(data) << " index " << block << " using 1:2 with points pt 7 ps 1.5 lc rgb '"
           << variant_colour(s, variant) << "' title " << quote(variant) << ", " << quote(data) << " index " << block
           << " using 1:2:3 with labels offset 1,0.6 font ',9' tc rgb '#555555' notitle";
    ++block;
  }
  d.close();
  if (points == 0) return;
  std::ostringstream script;
  script << "\nset title 'Training speed-up against training-FLOP reduction (vs " << baseline << ")'"
         << "\nset xlabel 'baseline FLOPs / variant FLOPs (training step, executed)'\nset ylabel 'variant tokens/s / "
            "baseline tokens/s'"
         << "\nset xrange [0:" << top << "]\nset yrange [0:" << top
         << "]\nplot x with lines dt 2 lc rgb '#888888' title 'wall-clock tracks FLOPs'" << plot.str() << "\n";
  site.render(name, script.str(),
              {"Speed-up against FLOP reduction", name,
               "Points on the dashed line turn FLOP savings into equal wall-clock savings; below it, savings are lost "
               "to overheads. Speeds are the tables' means, which leave out runs timed under other load."});
}

// The .dat/.gp files are gnuplot's inputs, not report content.
void remove_gnuplot_inputs(const std::string& out_dir, const std::string& prefix) {
  for (const auto& entry : boost::filesystem::directory_iterator(out_dir)) {
    const std::string f = entry.path().filename().string();
    if (f.rfind(prefix + "-", 0) == 0 && (entry.path().extension() == ".dat" || entry.path().extension() == ".gp"))
      boost::filesystem::remove(entry.path());
  }
}

}  // namespace

std::vector<Chart> draw_charts(const Summary& s, const std::string& out_dir, const std::string& prefix,
                               const std::string& baseline) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0)
    throw UserError("gnuplot is not installed (apt-get install gnuplot-nox); reports need it for charts");
  engine::ResultsReader store(s.db);
  std::vector<Chart> charts;
  const ChartSite site{s, store, out_dir, prefix, charts};
  for (const auto& t : s.tasks) {
    const ShownVariants shown = shown_variants(t, baseline);
    pareto_chart(site, t);
    curves_chart(site, t, shown);
    routing_chart(site, t, shown);
    entropy_chart(site, t);
  }
  speedup_chart(site, baseline);
  remove_gnuplot_inputs(out_dir, prefix);
  return charts;
}

}  // namespace chiar::report
