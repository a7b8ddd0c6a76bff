#include "process_group.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "chiar/error.h"
#include "sigpipe.h"

namespace chiar::engine {
namespace {

// ------------------------------------------------------------- messages

// One line out of a c10 or Gloo message: Gloo prefixes "[file.cc:123] ",
// c10 may span lines.
std::string clean_cause(std::string text) {
  while (!text.empty() && text[0] == '[') {
    const std::size_t close = text.find("] ");
    if (close == std::string::npos || text.find(':') > close) break;
    text = text.substr(close + 2);
  }
  std::string out;
  for (char c : text) {
    if (c == '\n') {
      if (!out.empty() && out.back() != ' ') out += "; ";
    } else {
      out += c;
    }
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == ';')) out.pop_back();
  return out.empty() ? "unknown error" : out;
}

std::string current_cause() {
  try {
    throw;
  } catch (const c10::Error& e) {
    return clean_cause(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return clean_cause(e.what());
  } catch (...) {
    return "unknown error";
  }
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

std::string seconds_text(std::chrono::milliseconds d) {
  std::ostringstream s;
  if (d.count() % 1000 == 0)
    s << d.count() / 1000 << " s";
  else
    s << d.count() << " ms";
  return s.str();
}

// Silences libtorch's logging (which c10d logs through) while it lives: c10d
// logs a failed connection to the store as an error line of its own, and the
// harness's policy is one message per failure, the EnvironmentError's. c10d
// gates its lines on caffe2_log_level in every build; a libtorch built with
// glog (Debian's) also filters by glog's own level, which PyTorch's wheels,
// built without glog, do not declare.
class QuietTorchLog {
 public:
  QuietTorchLog() : saved_(FLAGS_caffe2_log_level) {
    FLAGS_caffe2_log_level = kFatal;
#ifdef C10_USE_GLOG
    saved_glog_ = FLAGS_minloglevel;
    FLAGS_minloglevel = google::GLOG_FATAL;
#endif
  }
  ~QuietTorchLog() {
    FLAGS_caffe2_log_level = saved_;
#ifdef C10_USE_GLOG
    FLAGS_minloglevel = saved_glog_;
#endif
  }
  QuietTorchLog(const QuietTorchLog&) = delete;
  QuietTorchLog& operator=(const QuietTorchLog&) = delete;

 private:
  static constexpr int kFatal = 3;  // c10's and glog's severity numbering: INFO 0 .. FATAL 3
  std::decay_t<decltype(FLAGS_caffe2_log_level)> saved_;
#ifdef C10_USE_GLOG
  std::decay_t<decltype(FLAGS_minloglevel)> saved_glog_ = 0;
#endif
};

bool is_loopback(const std::string& host) { return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0; }

// --------------------------------------------------------------- buckets

std::string joined_key(int rank) { return "chiar/joined/" + std::to_string(rank); }
std::string beat_key(int rank) { return "chiar/beat/" + std::to_string(rank); }
std::string gave_up_key(int rank) { return "chiar/gave_up/" + std::to_string(rank); }

struct Bucket {
  std::vector<std::size_t> members;  // indices into the caller's tensors
  at::Tensor flat;                   // what the collective runs on
  bool in_place = false;             // flat is the caller's own tensor
};

enum class Reduction { kSum, kCopy };

// The dtype Gloo carries a tensor as. Gloo (libtorch 1.13) reduces and
// broadcasts uint8, int8, int32, int64, half, float and double only; other
// dtypes travel widened when that is exact (bfloat16 as float, int16 as
// int32, and bool as uint8 for a broadcast; a bfloat16 sum is rounded once,
// on the way back).
at::ScalarType wire_type(at::ScalarType type, Reduction reduction, const char* op) {
  switch (type) {
    case at::kByte:
    case at::kChar:
    case at::kInt:
    case at::kLong:
    case at::kHalf:
    case at::kFloat:
    case at::kDouble: return type;
    case at::kBFloat16: return at::kFloat;
    case at::kShort: return at::kInt;
    case at::kBool:
      if (reduction == Reduction::kCopy) return at::kByte;
      break;
    default: break;
  }
  throw std::invalid_argument(std::string("distributed ") + op + ": Gloo cannot carry " + c10::toString(type) +
                              " tensors");
}

void check_tensor(const at::Tensor& t, Reduction reduction, const char* op) {
  if (t.device().type() != at::kCPU)
    throw std::invalid_argument(std::string("distributed ") + op + ": tensors must be on the CPU (Gloo), found " +
                                t.device().str());
  if (t.layout() != at::kStrided)
    throw std::invalid_argument(std::string("distributed ") + op + ": tensors must be dense");
  wire_type(t.scalar_type(), reduction, op);
}

// Consecutive defined, non-empty tensors of one dtype, at most `cap` bytes
// (as carried) a bucket; a larger tensor goes alone.
std::vector<Bucket> plan_buckets(const std::vector<at::Tensor>& tensors, std::size_t cap, Reduction reduction) {
  std::vector<Bucket> buckets;
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined() || t.numel() == 0) continue;
    const std::size_t size =
        static_cast<std::size_t>(t.numel()) * c10::elementSize(wire_type(t.scalar_type(), reduction, ""));
    const bool fits = !buckets.empty() && tensors[buckets.back().members.front()].scalar_type() == t.scalar_type() &&
                      bytes + size <= cap;
    if (!fits) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().members.push_back(i);
    bytes += size;
  }
  return buckets;
}

// Packs each bucket: the tensor itself when it is alone, contiguous and of a
// dtype Gloo carries as is; else a flat copy of its members, widened if
// need be.
void pack(std::vector<Bucket>& buckets, const std::vector<at::Tensor>& tensors, Reduction reduction) {
  for (Bucket& b : buckets) {
    const at::Tensor& first = tensors[b.members[0]];
    const at::ScalarType wire = wire_type(first.scalar_type(), reduction, "");
    if (b.members.size() == 1 && first.is_contiguous() && wire == first.scalar_type()) {
      b.flat = first;
      b.in_place = true;
      continue;
    }
    std::vector<at::Tensor> parts;
    parts.reserve(b.members.size());
    for (std::size_t i : b.members) parts.push_back(tensors[i].reshape({-1}));
    b.flat = at::cat(parts).to(wire);
  }
}

// Copies each bucket back into its members (narrowing a widened dtype).
void unpack(const std::vector<Bucket>& buckets, std::vector<at::Tensor>& tensors) {
  for (const Bucket& b : buckets) {
    if (b.in_place) continue;
    int64_t offset = 0;
    for (std::size_t i : b.members) {
      at::Tensor& t = tensors[i];
      t.copy_(b.flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

}  // namespace

// The heartbeat's own state, shared with its thread: a thread stuck on a
// hung store is left behind (detached) rather than hanging the destructor.
struct Heartbeat {
  std::mutex mutex;
  std::condition_variable cv;
  bool stopping = false;
  bool finished = false;
};

struct ProcessGroup::Impl {
  WorldInfo world;
  ProcessGroupOptions options;
  c10::intrusive_ptr<c10d::TCPStore> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  std::shared_ptr<Heartbeat> heartbeat;
  std::thread heartbeat_thread;
  std::string broken;  // the failure's message, once failed

  std::string prefix() const {
    return "rank " + std::to_string(world.rank) + " of " + std::to_string(world.world_size) + ": ";
  }
  std::string where() const { return world.master_addr + ":" + std::to_string(world.master_port); }

  void check_usable() const {
    if (!broken.empty()) throw EnvironmentError(prefix() + "the process group failed earlier: " + broken);
  }

  void join();
  std::shared_ptr<::gloo::transport::Device> make_device() const;
  void start_heartbeat();
  void stop_heartbeat();
  std::string name_lost_peers();
  [[noreturn]] void fail(const std::string& op, const std::string& cause);

  // Starts a collective on Gloo; a refusal there (a dtype Gloo cannot
  // reduce...) is the caller's mistake, not the network's.
  template <typename Start>
  c10::intrusive_ptr<c10d::Work> start(const char* op, Start&& launch) {
    try {
      return launch();
    } catch (...) {
      throw std::invalid_argument(prefix() + op + ": " + current_cause());
    }
  }
  void finish(const char* op, const c10::intrusive_ptr<c10d::Work>& work) {
    try {
      work->wait();
    } catch (...) {
      fail(op, current_cause());
    }
  }
};

void ProcessGroup::Impl::join() {
  // Every rank announces itself, then waits for the others' announcements;
  // on a timeout the missing keys name the ranks that never came.
  std::vector<std::string> keys;
  for (int r = 0; r < world.world_size; ++r) keys.push_back(joined_key(r));
  try {
    store->set(joined_key(world.rank), std::vector<uint8_t>{1});
    store->wait(keys, options.join_timeout);
    return;
  } catch (...) {
    const std::string cause = current_cause();
    std::vector<int> missing;
    try {
      for (int r = 0; r < world.world_size; ++r)
        if (!store->check({joined_key(r)})) missing.push_back(r);
    } catch (...) {
      throw EnvironmentError(prefix() + "lost the rendezvous store at " + where() +
                             " while waiting for the other ranks to join: " + cause);
    }
    if (missing.empty()) throw EnvironmentError(prefix() + "joining the process group at " + where() + ": " + cause);
    throw EnvironmentError(prefix() + rank_list(missing) + " did not join the process group at " + where() +
                           " within " + seconds_text(options.join_timeout));
  }
}

std::shared_ptr<::gloo::transport::Device> ProcessGroup::Impl::make_device() const {
  std::string what;
  try {
    if (!options.gloo_address.empty()) {
      what = "address '" + options.gloo_address + "'";
      return c10d::ProcessGroupGloo::createDeviceForHostname(options.gloo_address);
    }
    if (is_loopback(world.master_addr)) {
      what = "address '127.0.0.1'";
      return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    }
    if (const char* names = std::getenv("GLOO_SOCKET_IFNAME"); names && *names) {
      const std::string first = std::string(names).substr(0, std::string(names).find(','));
      what = "interface '" + first + "' (GLOO_SOCKET_IFNAME)";
      return c10d::ProcessGroupGloo::createDeviceForInterface(first);
    }
    what = "this host's name (set GLOO_SOCKET_IFNAME to choose an interface)";
    return c10d::ProcessGroupGloo::createDefaultDevice();
  } catch (...) {
    throw EnvironmentError(prefix() + "cannot open a Gloo device on " + what + ": " + current_cause());
  }
}

void ProcessGroup::Impl::start_heartbeat() {
  if (options.heartbeat_interval.count() <= 0) return;
  heartbeat = std::make_shared<Heartbeat>();
  heartbeat_thread =
      std::thread([state = heartbeat, store = store, key = beat_key(world.rank), period = options.heartbeat_interval] {
        std::unique_lock<std::mutex> lock(state->mutex);
        while (!state->stopping) {
          lock.unlock();
          try {
            store->add(key, 1);
          } catch (...) {
            // The store is gone (rank 0 ended) or busy: the next beat retries,
            // and a failing collective reports the cause.
          }
          lock.lock();
          state->cv.wait_for(lock, period, [&] { return state->stopping; });
        }
        state->finished = true;
        state->cv.notify_all();
      });
}

void ProcessGroup::Impl::stop_heartbeat() {
  if (!heartbeat_thread.joinable()) return;
  std::unique_lock<std::mutex> lock(heartbeat->mutex);
  heartbeat->stopping = true;
  heartbeat->cv.notify_all();
  const bool finished = heartbeat->cv.wait_for(lock, options.timeout, [&] { return heartbeat->finished; });
  lock.unlock();
  if (finished)
    heartbeat_thread.join();
  else
    heartbeat_thread.detach();  // stuck on a hung store; it owns what it uses
}

// After a failed collective: which peers stopped beating? Returns "" when no
// peer can be named.
std::string ProcessGroup::Impl::name_lost_peers() {
  const std::string store_gone = "rank 0, which serves the rendezvous store at " + where() + ", is unreachable";
  std::vector<int64_t> before(world.world_size), after(world.world_size);
  try {
    store->set(gave_up_key(world.rank), std::vector<uint8_t>{1});
    if (options.heartbeat_interval.count() <= 0) return "";
    for (int r = 0; r < world.world_size; ++r) before[r] = store->add(beat_key(r), 0);
  } catch (...) {
    return world.rank == 0 ? "" : store_gone;
  }
  // Three periods: a live rank beats at least twice meanwhile.
  std::this_thread::sleep_for(3 * options.heartbeat_interval);
  std::vector<int> stopped, left;
  try {
    for (int r = 0; r < world.world_size; ++r) after[r] = store->add(beat_key(r), 0);
    for (int r = 0; r < world.world_size; ++r) {
      if (r == world.rank || after[r] != before[r]) continue;
      (store->check({gave_up_key(r)}) ? left : stopped).push_back(r);
    }
  } catch (...) {
    return world.rank == 0 ? "" : store_gone;
  }
  if (!stopped.empty()) return "peer " + rank_list(stopped) + " stopped responding";
  if (!left.empty()) return "peer " + rank_list(left) + " left after losing contact itself";
  return "";
}

void ProcessGroup::Impl::fail(const std::string& op, const std::string& cause) {
  const std::string peers = name_lost_peers();
  broken =
      "lost contact with the process group during " + op + (peers.empty() ? "" : " (" + peers + ")") + ": " + cause;
  throw EnvironmentError(prefix() + broken);
}

struct PendingCollective::State {
  ProcessGroup::Impl* impl = nullptr;
  const char* op = "";
  bool mean = false;
  std::vector<at::Tensor> tensors;
  std::vector<Bucket> buckets;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  bool done = false;
};

PendingCollective::PendingCollective() = default;
PendingCollective::PendingCollective(std::unique_ptr<State> state) : state_(std::move(state)) {}
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;
PendingCollective& PendingCollective::operator=(PendingCollective&&) noexcept = default;
PendingCollective::~PendingCollective() = default;

void PendingCollective::wait() {
  if (!state_ || state_->done) return;
  State& s = *state_;
  s.done = true;
  s.impl->check_usable();
  for (const auto& work : s.works) s.impl->finish(s.op, work);
  if (s.mean) {
    const double n = static_cast<double>(s.impl->world.world_size);
    for (Bucket& b : s.buckets) b.flat.div_(n);
  }
  unpack(s.buckets, s.tensors);
  s.works.clear();
}

ProcessGroup::ProcessGroup(const WorldInfo& world, const ProcessGroupOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.world = world;
  m.options = options;
  if (world.world_size < 1 || world.rank < 0 || world.rank >= world.world_size)
    throw std::invalid_argument("ProcessGroup: rank " + std::to_string(world.rank) + " is outside a world of " +
                                std::to_string(world.world_size));
  if (options.timeout.count() <= 0 || options.join_timeout.count() <= 0 || options.bucket_bytes == 0 ||
      options.gloo_threads < 1)
    throw std::invalid_argument("ProcessGroup: timeout, join_timeout, bucket_bytes and gloo_threads must be positive");
  if (world.world_size == 1) return;
  if (world.master_addr.empty() || world.master_port < 1 || world.master_port > 65535)
    throw std::invalid_argument("ProcessGroup: a world of " + std::to_string(world.world_size) +
                                " needs master_addr and master_port");

  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(world.master_port);
  store_options.isServer = world.rank == 0;
  store_options.numWorkers = c10::nullopt;  // join() waits, naming the missing
  store_options.waitWorkers = false;
  store_options.timeout = options.join_timeout;
  try {
    QuietTorchLog quiet;
    m.store = c10::make_intrusive<c10d::TCPStore>(world.master_addr, store_options);
  } catch (...) {
    throw EnvironmentError(
        m.prefix() +
        (world.rank == 0
             ? "cannot serve the rendezvous store on port " + std::to_string(world.master_port)
             : "cannot reach the rendezvous store at " + m.where() + " within " + seconds_text(options.join_timeout)) +
        ": " + current_cause());
  }
  m.join();

  const SigpipeBlock block_sigpipe;  // for every thread Gloo and the heartbeat start (sigpipe.h)
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  gloo_options->devices.push_back(m.make_device());
  gloo_options->threads = options.gloo_threads;
  try {
    m.gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(m.store, world.rank, world.world_size, gloo_options);
  } catch (...) {
    throw EnvironmentError(m.prefix() + "cannot connect to the other ranks (rendezvous at " + m.where() +
                           "): " + current_cause());
  }
  // Joined: from now on a store operation that hangs is a lost peer too.
  m.store->setTimeout(options.timeout);
  m.start_heartbeat();
}

ProcessGroup::~ProcessGroup() {
  if (!impl_) return;
  impl_->stop_heartbeat();
  // Gloo's destructor drains its queue (each queued collective ends, by
  // success or timeout), then the store; rank 0's store server goes last.
  impl_->gloo.reset();
  impl_->store.reset();
}

int ProcessGroup::rank() const { return impl_->world.rank; }
int ProcessGroup::size() const { return impl_->world.world_size; }

PendingCollective ProcessGroup::allreduce_mean_async(std::vector<at::Tensor> tensors) {
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!at::isFloatingType(t.scalar_type()))
      throw std::invalid_argument(std::string("distributed allreduce_mean: expected floating-point tensors, found ") +
                                  c10::toString(t.scalar_type()));
    check_tensor(t, Reduction::kSum, "allreduce_mean");
  }
  if (impl_->world.world_size == 1) return PendingCollective();
  impl_->check_usable();
  auto state = std::make_unique<PendingCollective::State>();
  state->impl = impl_.get();
  state->op = "allreduce";
  state->mean = true;
  state->tensors = std::move(tensors);
  state->buckets = plan_buckets(state->tensors, impl_->options.bucket_bytes, Reduction::kSum);
  pack(state->buckets, state->tensors, Reduction::kSum);
  for (Bucket& b : state->buckets) {
    state->works.push_back(impl_->start("allreduce", [&] {
      std::vector<at::Tensor> one{b.flat};
      return impl_->gloo->allreduce(one, c10d::AllreduceOptions{});
    }));
  }
  return PendingCollective(std::move(state));
}

void ProcessGroup::allreduce_mean(std::vector<at::Tensor>& tensors) {
  // The pending collective holds the same tensors (shared storage), so the
  // copy-back lands in the caller's.
  allreduce_mean_async(tensors).wait();
}

void ProcessGroup::allreduce_sum(at::Tensor& tensor) {
  if (!tensor.defined()) throw std::invalid_argument("distributed allreduce_sum: undefined tensor");
  check_tensor(tensor, Reduction::kSum, "allreduce_sum");
  if (impl_->world.world_size == 1 || tensor.numel() == 0) return;
  impl_->check_usable();
  const at::ScalarType wire = wire_type(tensor.scalar_type(), Reduction::kSum, "allreduce_sum");
  std::vector<at::Tensor> one{tensor.is_contiguous() && wire == tensor.scalar_type() ? tensor
                                                                                     : tensor.contiguous().to(wire)};
  auto work = impl_->start("allreduce", [&] { return impl_->gloo->allreduce(one, c10d::AllreduceOptions{}); });
  impl_->finish("allreduce", work);
  if (!one[0].is_same(tensor)) tensor.copy_(one[0]);
}

void ProcessGroup::broadcast(std::vector<at::Tensor>& tensors, int root) {
  for (const at::Tensor& t : tensors)
    if (t.defined()) check_tensor(t, Reduction::kCopy, "broadcast");
  if (root < 0 || root >= impl_->world.world_size)
    throw std::invalid_argument("distributed broadcast: root " + std::to_string(root) + " is outside a world of " +
                                std::to_string(impl_->world.world_size));
  if (impl_->world.world_size == 1) return;
  impl_->check_usable();
  auto state = std::make_unique<PendingCollective::State>();
  state->impl = impl_.get();
  state->op = "broadcast";
  state->tensors = tensors;
  state->buckets = plan_buckets(state->tensors, impl_->options.bucket_bytes, Reduction::kCopy);
  pack(state->buckets, state->tensors, Reduction::kCopy);
  c10d::BroadcastOptions options;
  options.rootRank = root;
  for (Bucket& b : state->buckets) {
    state->works.push_back(impl_->start("broadcast", [&] {
      std::vector<at::Tensor> one{b.flat};
      return impl_->gloo->broadcast(one, options);
    }));
  }
  PendingCollective(std::move(state)).wait();
}

std::string ProcessGroup::broadcast_string(const std::string& text, int root) {
  if (impl_->world.world_size == 1) return text;
  // Two broadcasts: the length, then the bytes.
  const bool is_root = impl_->world.rank == root;
  std::vector<at::Tensor> length{at::full({1}, is_root ? static_cast<int64_t>(text.size()) : int64_t{0}, at::kLong)};
  broadcast(length, root);
  const int64_t n = length[0].item<int64_t>();
  if (n == 0) return "";
  std::vector<at::Tensor> bytes{at::empty({n}, at::kByte)};
  if (is_root) std::memcpy(bytes[0].data_ptr(), text.data(), text.size());
  broadcast(bytes, root);
  return std::string(static_cast<const char*>(bytes[0].data_ptr()), static_cast<std::size_t>(n));
}

void ProcessGroup::barrier() {
  if (impl_->world.world_size == 1) return;
  impl_->check_usable();
  auto work = impl_->start("barrier", [&] { return impl_->gloo->barrier(c10d::BarrierOptions{}); });
  impl_->finish("barrier", work);
}

}  // namespace chiar::engine
