#pragma once
// The checks every plugin should pass, shared by the in-tree plugins' tests and
// by out-of-tree plugins (the scaffold's test calls them). Each returns the
// failures, one readable line each; empty means the plugin conforms.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "chiar/export.h"
#include "chiar/operator.h"
#include "chiar/router.h"
#include "chiar/task.h"

namespace chiar {

// make(d_model, n_heads) builds a fresh operator. Checked: a colour in its
// traits of the form #rrggbb; in float64: shape and
// dtype, finite outputs, causality (when traits().causal), padding invariance
// (when traits().padded), forward_rows == rows of forward (with and without
// OpContext::host_rows), flops() non-negative
// and increasing in T, and a finite-difference gradient check.
CHIAR_API std::vector<std::string> check_operator(
    const std::function<std::shared_ptr<Operator>(int64_t d_model, int64_t n_heads)>& make);

// make(operators) builds a router over that many operators (2 and 3 are tried;
// a factory that refuses a count is skipped). The names stand for operator
// roles, cheapest first ("cheap_mixing", "intermediate_mixing",
// "global_mixing"); no operator is made. Checked: weights (B, T, K) are
// non-negative and sum to 1, choice is the argmax of the weights, hard routers
// give one-hot weights, and causal decisions never depend on later tokens.
CHIAR_API std::vector<std::string> check_router(
    const std::function<std::shared_ptr<Router>(const std::vector<std::string>& operators)>& make);

// Checked: every split has examples and tokens; training batches are a pure
// function of (seed, step); targets lie in the vocabulary or the classes;
// evaluation batches exist and have masks of their token shape.
CHIAR_API std::vector<std::string> check_task(const Task& task);

}  // namespace chiar
