#pragma once
// The device a run trains on: train.device (or --device) is "auto", "cpu",
// "cuda" or "cuda:N". Like the thread count it is recorded with the run but
// is not part of the run's hash: a matrix finished on one device is not
// rerun on another, unless the device changes its default precision
// (resolve_precision below), which is.
#include <string>

#include <c10/core/Device.h>

#include "chiar/task.h"

namespace chiar::engine {

// Whether this libtorch carries its CUDA library (whatever the machine has).
bool built_with_cuda();

// Whether this build lets a run train on a CUDA device (configured with
// -DCHIAR_CUDA_TRAINING=ON; resolve_device refuses one otherwise).
bool cuda_training_enabled();

// Whether `name` is one of the forms above ("" when it is, else the
// complaint, for the option table's check).
std::string device_name_problem(const std::string& name);

// What "auto" trains on: in a build with -DCHIAR_CUDA_TRAINING=ON, cuda:0
// when libtorch has CUDA and the machine shows a GPU; otherwise, and for the
// processes of a data-parallel run (`host_only`: they average gradients in
// host memory), the CPU. A build without that option trains on the CPU only
// (CUDA training is not yet checked on a GPU), so there "auto" is the CPU.
std::string auto_device(bool host_only = false);

// What this process can train on, as a device name ("cpu", or "cuda:N").
// Throws UserError, prefixed by `origin` (where the name came from:
// "m.toml:12:10: key 'train.device'", "--device"), for a device this build
// or this machine cannot give:
//   <origin>: "cuda" needs a libtorch built with CUDA; this build has none
//   <origin>: "cuda:2": this machine shows 1 CUDA device (cuda:0)
// and, in a build without -DCHIAR_CUDA_TRAINING=ON, for any CUDA device:
//   <origin>: "cuda": this build trains on the CPU only (...); use "cpu"
std::string resolve_device(const std::string& name, const std::string& origin, bool host_only = false);

// The precision a run computes in: train.precision as given, except "auto",
// which is bf16 (autocast, fp32 master weights) on a GPU and fp32 on the CPU.
// `device` is a train.device value, resolved or not: "cuda" and "cuda:N"
// count as a GPU whether or not this machine has one (resolve_device refuses
// a device it cannot give before anything runs). A matrix resolves "auto"
// before it hashes a run, so a run's hash names its arithmetic: a
// default-precision matrix finished on the CPU is a different set of runs on
// a GPU, and a run moves between devices (resumes on the other) when its
// precision is set explicitly.
std::string resolve_precision(const std::string& precision, const std::string& device, bool host_only = false);

// What a run records as its device: "cpu", or for "cuda:N" the GPU as the
// driver describes it (nvidia_smi_description) and libtorch's CUDA runtime
// and cuDNN versions, e.g. "cuda:0 (NVIDIA H200, 140.4 GiB, compute
// capability 9.0, driver 570.86.15; libtorch CUDA 12080, cuDNN 90100;
// harness CUDA kernels on (built with CUDA 12.8; runtime 12.8, driver 12.4))".
std::string describe_device(const std::string& resolved);

// GPU `index` as `nvidia-smi` (found on PATH) reports it: "NVIDIA H200,
// 140.4 GiB, compute capability 9.0, driver 570.86.15"; when it cannot be
// asked, what went wrong ("nvidia-smi: not found or failed").
std::string nvidia_smi_description(int64_t index);

// libtorch's device for a name resolve_device returned.
at::Device torch_device(const std::string& resolved);

// Sets what a run on `device` computes under, process-wide: on a GPU, fp32
// products in IEEE fp32 rather than TF32 (libtorch's default, which the
// TORCH_ALLOW_TF32_CUBLAS_OVERRIDE environment variable turns around), so
// that precision "fp32" means fp32 and a run's CPU and GPU losses agree to
// fp32's error. Nothing on the CPU.
void configure_device(const at::Device& device);

// The CPU's bf16 instructions as the kernel lists them in /proc/cpuinfo
// ("avx512_bf16", "amx_bf16"), comma-separated; empty when it has none:
// libtorch then converts bf16 to fp32 around every product, and a bf16 run
// is slower than an fp32 one.
std::string cpu_bf16_instructions();

// Says so on stderr, once per process, when a bf16 run or benchmark is on
// the CPU and its products sum in bf16, or the CPU has no bf16 instructions.
// The run goes on either way.
void warn_about_cpu_bf16(const at::Device& device, bool bf16);

// Waits for the work queued on `device` (nothing to wait for on the CPU): a
// GPU runs a step's kernels after the host has moved on, so a host clock
// read around them stops only once they are done.
void synchronize_device(const at::Device& device);

// Checks, in host memory before the batch moves, that every target lies in
// [0, top): the vocabulary (a language model) or the classes. On a GPU the
// loss would otherwise read outside its row, or give the row NaN, instead of
// naming the fault. Throws UserError, e.g.
//   task 'lm' training step 12: target 8192 at [3, 17] is outside the vocabulary [0, 8192)
void check_batch_targets(const Batch& host, int64_t top, bool vocabulary, const std::string& where);

// The batch on `device`. Tasks build batches in pageable host memory, and
// CUDA may wait for the stream's queued work before it copies from there
// (it stages such a copy through pinned memory of its own): on another
// device each tensor is first copied into pinned memory, and from there
// over without blocking the host, the copy queued behind the work already
// queued. libtorch's host allocator keeps a pinned buffer until its copy
// has run. On the CPU: the batch itself.
Batch batch_on(const Batch& batch, const at::Device& device);

}  // namespace chiar::engine
