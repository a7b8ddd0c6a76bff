// Precompiled once, reused by every target: the libtorch headers our sources use.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/functional/activation.h>
#include <torch/autograd.h>
#include <torch/utils.h>
