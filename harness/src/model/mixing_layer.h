#pragma once
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "chiar/operator.h"
#include "chiar/router.h"

namespace chiar::model {

// How a routed layer executes its decision.
enum class Execution {
  Auto,    // dense for soft routing and for STE while the gate trains, sparse otherwise
  Dense,   // every operator on every token, outputs blended by the weights
  Sparse,  // rows gathered per operator, each operator runs on its rows only
};
const char* to_string(Execution e);
Execution execution_from_string(const std::string& name);

// What a routed layer decided in one forward pass (detached).
struct LayerRouting {
  int64_t layer = 0;
  at::Tensor choice;    // (B, T) int64 operator index
  at::Tensor entropy;   // (B, T) spectral entropy of the layer input
  at::Tensor weights;   // (B, T, K) blend weights
  bool sparse = false;  // executed sparsely
  RouteMode mode = RouteMode::Hard;
};

// The operator sub-layer of one block: a single operator, or K operators with a
// router choosing per token. Operators include their own residual + LayerNorm.
class MixingLayer : public torch::nn::Module {
 public:
  MixingLayer(int64_t index, std::vector<std::string> names, std::vector<std::shared_ptr<Operator>> operators,
              std::shared_ptr<Router> router);

  // x: (B, T, d) -> (B, T, d). For a routed layer, fills *routing and adds the
  // router's auxiliary loss to *aux_loss (either may be null).
  at::Tensor forward(const at::Tensor& x, const OpContext& ctx, LayerRouting* routing = nullptr,
                     at::Tensor* aux_loss = nullptr);

  bool routed() const { return router_ != nullptr; }
  void set_execution(Execution e) { execution_ = e; }
  Execution execution() const { return execution_; }
  const std::vector<std::string>& operator_names() const { return names_; }
  const std::vector<std::shared_ptr<Operator>>& operators() const { return operators_; }
  const std::shared_ptr<Router>& router() const { return router_; }
  std::string describe() const;

 private:
  at::Tensor dense(const at::Tensor& x, const OpContext& ctx, const RouteResult& r) const;
  at::Tensor sparse(const at::Tensor& x, const OpContext& ctx, const at::Tensor& choice) const;
  // Throws naming the layer when a choice (N,) lies outside 0 .. K-1.
  void check_choices(const at::Tensor& flat_choice) const;

  int64_t index_;
  std::vector<std::string> names_;
  std::vector<std::shared_ptr<Operator>> operators_;
  std::shared_ptr<Router> router_;
  Execution execution_ = Execution::Auto;
};

}  // namespace chiar::model
