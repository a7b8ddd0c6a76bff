#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "chiar/registry.h"
#include "report/html.h"
#include "report/inspect.h"
#include "chiar/error.h"
#include "chiar/text_io.h"
#include "commands.h"
#include "output_file.h"

namespace chiar::cli {
namespace {

// The terminal colour of an operator's "#rrggbb": the ANSI hue (red, yellow,
// green, cyan, blue, magenta) nearest to its hue, a hue midway between two
// going to the later; a grey gets the terminal's own colour. Integer
// arithmetic, so a colour maps the same way on every machine.
std::string ansi(const std::string& colour) {
  const auto channel = [&](size_t at) { return std::stol(colour.substr(at, 2), nullptr, 16); };
  const long r = channel(1), g = channel(3), b = channel(5);
  const long hi = std::max({r, g, b}), delta = hi - std::min({r, g, b});
  if (delta < 8) return "\033[39m";
  // Hue in degrees times delta, shifted by half a sector.
  const long h = (hi == r   ? 60 * (g - b)
                  : hi == g ? 120 * delta + 60 * (b - r)
                            : 240 * delta + 60 * (r - g)) +
                 30 * delta;
  const long sector = ((h >= 0 ? h / (60 * delta) : -((-h + 60 * delta - 1) / (60 * delta))) % 6 + 6) % 6;
  static const char* const kCodes[] = {"\033[31m", "\033[33m", "\033[32m", "\033[36m", "\033[34m", "\033[35m"};
  return kCodes[sector];
}

// The traits of the operators routes name, asked of the registry once each.
class OperatorLooks {
 public:
  explicit OperatorLooks(const PluginRegistry& registry) : registry_(registry) {}
  const OperatorTraits& operator()(const std::string& op) {
    auto it = traits_.find(op);
    if (it == traits_.end()) it = traits_.emplace(op, registry_.operator_traits(op)).first;
    return it->second;
  }

 private:
  const PluginRegistry& registry_;
  std::map<std::string, OperatorTraits> traits_;  // by registered name, as the routes name them
};

// The text to route: --text, else --file's lines, else standard input's;
// "" when a corpus is given instead.
std::string text_to_route(const InspectArgs& a) {
  if (!a.text.empty() || !a.corpus.empty()) return a.text;
  const bool from_stdin = a.file.empty() || a.file == "-";
  std::vector<std::string> lines = from_stdin ? std::vector<std::string>() : read_lines(a.file);
  if (from_stdin) {
    std::string line;
    while (std::getline(std::cin, line)) lines.push_back(line);
  }
  std::string text;
  for (const auto& l : lines) text += (text.empty() ? "" : "\n") + l;
  return text;
}

// One line per token: its id, and per routed layer its entropy and route.
void print_routes_tsv(const report::Inspection& ins) {
  std::cout << "token\tid";
  for (int64_t l : ins.layers) std::cout << "\tL" << l + 1 << "_H\tL" << l + 1 << "_route";
  std::cout << "\n";
  for (const auto& t : ins.tokens) {
    std::cout << t.text << "\t" << t.id;
    for (size_t l = 0; l < ins.layers.size(); ++l)
      std::cout << "\t" << report::fixed(t.entropy[l], 6) << "\t" << ins.operators[l][t.route[l]];
    std::cout << "\n";
  }
}

// The same as a table for the terminal (routes coloured when `color`),
// then each routed layer's share of tokens per operator.
void print_routes_table(const report::Inspector& inspector, const report::Inspection& ins, bool color,
                        OperatorLooks& looks) {
  std::cout << inspector.spec().name() << " (" << inspector.checkpoint_file() << ")\n\n"
            << std::left << std::setw(18) << "token";
  for (int64_t l : ins.layers) std::cout << std::setw(22) << ("layer " + std::to_string(l + 1) + ": H route");
  std::cout << "\n";
  for (const auto& t : ins.tokens) {
    std::cout << std::setw(18) << t.text.substr(0, 17);
    for (size_t l = 0; l < ins.layers.size(); ++l) {
      const std::string& op = ins.operators[l][t.route[l]];
      std::cout << report::fixed(t.entropy[l], 4) << "  " << (color ? ansi(looks(op).colour) : "") << std::setw(14)
                << op << (color ? "\033[0m" : "");
    }
    std::cout << "\n";
  }
  std::cout << "\nshare of tokens per operator:\n";
  for (size_t l = 0; l < ins.layers.size(); ++l) {
    std::map<std::string, int64_t> n;
    for (const auto& t : ins.tokens) ++n[ins.operators[l][t.route[l]]];
    std::cout << "  layer " << ins.layers[l] + 1 << ":";
    for (const auto& op : ins.operators[l])
      std::cout << "  " << op << " "
                << report::fixed(100.0 * static_cast<double>(n[op]) / std::max<size_t>(1, ins.tokens.size()), 1) << "%";
    std::cout << "\n";
  }
}

// The routes as an HTML page: every token on its route's colour, per layer.
void write_routes_html(const std::string& path, const report::Inspector& inspector, const report::Inspection& ins,
                       OperatorLooks& looks) {
  std::ostringstream html;
  html << "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Routes: "
       << report::html_escape(inspector.spec().name())
       << "</title><style>body{font-family:Helvetica,Arial,sans-serif;max-width:1000px;margin:2em "
          "auto;line-height:2}"
          "span.t{padding:2px 3px;margin:1px;border-radius:3px}.legend span{padding:2px "
          "8px;margin-right:8px}</style></head><body>\n<h1>Routes of "
       << report::html_escape(inspector.spec().name()) << "</h1>\n<p class=\"legend\">";
  std::vector<std::string> legend;  // every routed layer's operators, in order of appearance
  for (const auto& ops : ins.operators)
    for (const auto& op : ops)
      if (std::find(legend.begin(), legend.end(), op) == legend.end()) legend.push_back(op);
  for (const auto& op : legend)
    html << "<span style=\"background:" << looks(op).colour << "\">" << report::html_escape(looks(op).display_name)
         << "</span>";
  html << " Hover a token for its spectral entropy H and route in every routed layer.</p>\n";
  for (size_t l = 0; l < ins.layers.size(); ++l) {
    html << "<h2>Layer " << ins.layers[l] + 1 << "</h2>\n<p>";
    for (const auto& t : ins.tokens) {
      std::string tip;
      for (size_t k = 0; k < ins.layers.size(); ++k)
        tip += "layer " + std::to_string(ins.layers[k] + 1) + ": H " + report::fixed(t.entropy[k], 4) + " " +
               ins.operators[k][t.route[k]] + "\n";
      html << "<span class=\"t\" style=\"background:" << looks(ins.operators[l][t.route[l]]).colour << "\" title=\""
           << report::html_escape(tip) << "\">" << report::html_escape(t.text) << "</span> ";
    }
    html << "</p>\n";
  }
  html << "</body></html>\n";
  write_output_file(path, html.str());
  std::cerr << "wrote " << path << "\n";
}

// A corpus's tokens most and least often sent to global mixing.
void print_corpus_rates(report::Inspector& inspector, const InspectArgs& a) {
  const auto [most, least] = inspector.corpus(read_lines(a.corpus), a.max_tokens, a.top, a.min_count);
  std::string global;
  for (const auto& op : inspector.global_mixing()) global += (global.empty() ? "" : " or ") + op;
  if (global.empty()) global = "global mixing";
  auto print = [&](const std::string& title, const std::vector<report::TokenRate>& rows) {
    std::cout << "\n" << title << " (tokens seen at least " << a.min_count << " times)\n";
    for (const auto& r : rows)
      std::cout << "  " << std::left << std::setw(18) << r.text.substr(0, 17) << std::right << std::setw(7)
                << report::fixed(100 * r.global, 1) << "%  of " << r.count << "\n";
  };
  print("most often sent to " + global, most);
  print("least often sent to " + global, least);
}

}  // namespace

int run_inspect(const Global& g, const InspectArgs& a) {
  PluginRegistry registry;
  registry.load_default(g.plugin_dirs);
  report::InspectOptions o;
  o.db = a.db;
  o.run = a.run;
  o.checkpoint = a.checkpoint;
  o.data_root = a.data_root;
  o.cache_dir = a.cache_dir;
  if (!a.html.empty()) check_output_file(a.html);
  report::Inspector inspector(registry, o);
  OperatorLooks looks(registry);
  if (const std::string text = text_to_route(a); !text.empty()) {
    const auto ins = inspector.inspect(text);
    if (a.tsv)
      print_routes_tsv(ins);
    else
      print_routes_table(inspector, ins, a.color == "always" || (a.color == "auto" && isatty(STDOUT_FILENO)), looks);
    if (!a.html.empty()) write_routes_html(a.html, inspector, ins, looks);
  }
  if (!a.corpus.empty()) print_corpus_rates(inspector, a);
  return 0;
}

}  // namespace chiar::cli
