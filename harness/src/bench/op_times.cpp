#include "op_times.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace chiar::bench {

namespace {

using Clock = std::chrono::steady_clock;

// A call in progress on this thread.
struct Frame {
  Clock::time_point start;
  double inner_ms = 0;  // the time of the calls made inside it
  std::string op, scope;
};
thread_local std::vector<Frame> t_open;

std::mutex g_mutex;
std::map<std::pair<std::string, std::string>, OpTime> g_times;  // by (op, scope)

// Not a scope: libtorch's own operators, and the autograd engine's wrapper
// around each node (the node itself is the scope).
bool is_scope(const std::string& name) {
  return name.rfind("aten::", 0) != 0 && name.rfind("autograd::engine::evaluate_function: ", 0) != 0;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  Frame f{Clock::now(), 0.0, fn.name(), {}};
  for (auto it = t_open.rbegin(); it != t_open.rend(); ++it)
    if (is_scope(it->op)) {
      f.scope = it->op;
      break;
    }
  t_open.push_back(std::move(f));
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) {
  if (t_open.empty()) return;  // began before the recorder did
  Frame f = std::move(t_open.back());
  t_open.pop_back();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - f.start).count();
  if (!t_open.empty()) t_open.back().inner_ms += ms;
  const std::lock_guard<std::mutex> lock(g_mutex);
  OpTime& t = g_times[{f.op, f.scope}];
  t.self_ms += ms - f.inner_ms;
  t.total_ms += ms;
  ++t.calls;
}

}  // namespace

OpRecorder::OpRecorder() {
  {
    const std::lock_guard<std::mutex> lock(g_mutex);
    g_times.clear();
  }
  handle_ = at::addGlobalCallback(
      at::RecordFunctionCallback(on_start, on_end)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION, at::RecordScope::USER_SCOPE}));
}

OpRecorder::~OpRecorder() { at::removeCallback(handle_); }

std::vector<OpTime> OpRecorder::times() const {
  std::vector<OpTime> out;
  {
    const std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& [key, t] : g_times) {
      out.push_back(t);
      out.back().op = key.first;
      out.back().scope = key.second;
    }
  }
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.self_ms > b.self_ms; });
  return out;
}

}  // namespace chiar::bench
