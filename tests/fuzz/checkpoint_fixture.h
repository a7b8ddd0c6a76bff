#pragma once
// A state checkpoint laid out as engine/training/training_state.cpp state_bytes writes one
// (tiny model, AdamW, step, best, has_best, train_seconds, rng), for the
// checkpoint fuzz target and its seed writer. Deterministic: the same bytes
// on every call in every process.
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <sstream>
#include <string>

namespace chiar::fuzz {

inline std::string reference_checkpoint() {
  torch::manual_seed(0);
  torch::nn::Linear model(4, 3);
  torch::optim::AdamW optimizer(model->parameters());
  model->forward(torch::ones({2, 4})).sum().backward();
  optimizer.step();
  torch::serialize::OutputArchive archive, opt;
  model->save(archive);
  optimizer.save(opt);
  archive.write("optimizer", opt);
  archive.write("step", at::tensor(int64_t{1}));
  archive.write("best", at::tensor(0.5, at::TensorOptions().dtype(at::kDouble)));
  archive.write("has_best", at::tensor(int64_t{1}));
  archive.write("train_seconds", at::tensor(1.25, at::TensorOptions().dtype(at::kDouble)));
  archive.write("rng", at::detail::getDefaultCPUGenerator().get_state());
  std::ostringstream bytes;
  archive.save_to(bytes);
  return bytes.str();
}

}  // namespace chiar::fuzz
