#include "engine/training/training_state.h"

#include <ATen/ATen.h>
#include <torch/serialize.h>

#include <mutex>

namespace chiar::engine {
namespace {

// The state of a device's default generator (the CPU's, or a GPU's, from
// which dropout on that device draws), read and set under its lock. A state
// is a CPU byte tensor whatever the checkpoint's mapping.
at::Tensor generator_state(at::Device device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(at::Device device, const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state.cpu());
}

}  // namespace

std::string archive_bytes(torch::serialize::OutputArchive& archive) {
  std::string bytes;
  archive.save_to([&bytes](const void* data, size_t n) {
    bytes.append(static_cast<const char*>(data), n);
    return n;
  });
  return bytes;
}

std::string state_bytes(model::ChiarModel& model, torch::optim::AdamW& optimizer, const at::Device& device,
                        const ResumePoint& point) {
  torch::serialize::OutputArchive archive;
  model.save(archive);
  torch::serialize::OutputArchive optimizer_archive;
  optimizer.save(optimizer_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("step", at::tensor(point.step));
  archive.write("best", at::tensor(point.best, at::TensorOptions().dtype(at::kDouble)));
  archive.write("has_best", at::tensor(static_cast<int64_t>(point.has_best)));
  archive.write("train_seconds", at::tensor(point.train_seconds, at::TensorOptions().dtype(at::kDouble)));
  if (point.validate_first) archive.write("unvalidated", at::tensor(int64_t{1}));
  archive.write("rng", generator_state(at::kCPU));
  // Dropout on a GPU draws from the device's own generator: without its
  // state a resumed run would draw other masks than an uninterrupted one.
  if (device.is_cuda()) archive.write("cuda_rng", generator_state(device));
  return archive_bytes(archive);
}

ResumePoint restore_state(model::ChiarModel& model, torch::optim::AdamW& optimizer, const at::Device& device,
                          const std::string& bytes) {
  // Storages map to the run's device, wherever the file was written: a
  // checkpoint written on a GPU resumes on the CPU and the other way round.
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size(), device);
  model.load(archive);
  torch::serialize::InputArchive optimizer_archive;
  archive.read("optimizer", optimizer_archive);
  optimizer.load(optimizer_archive);
  auto read = [&](const char* key) {
    at::Tensor v;  // a fresh tensor per read: read() swaps in the stored storage
    archive.read(key, v);
    return v;
  };
  ResumePoint point;
  point.step = read("step").item<int64_t>();
  point.best = read("best").item<double>();
  point.has_best = read("has_best").item<int64_t>() != 0;
  point.train_seconds = read("train_seconds").item<double>();
  at::Tensor unvalidated;  // written only when a stop cut the step's validation short
  point.validate_first = archive.try_read("unvalidated", unvalidated);
  set_generator_state(at::kCPU, read("rng"));
  // A GPU checkpoint resumed on the CPU has no use for the device's state; a
  // CPU checkpoint resumed on a GPU has none, and its dropout masks go on
  // from the device generator's seed instead.
  at::Tensor cuda_rng;
  if (device.is_cuda() && archive.try_read("cuda_rng", cuda_rng)) set_generator_state(device, cuda_rng);
  return point;
}

}  // namespace chiar::engine
