#include "engine/runtime/queue_mark.h"

#include "chiar_build_info.h"  // CHIAR_TORCH_CUDA
#include "engine/runtime/device.h"
#if CHIAR_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace chiar::engine {

#if CHIAR_TORCH_CUDA
struct QueueMark::Event {
  at::cuda::CUDAEvent event;  // without timing: the cheapest kind to record and wait for
};

bool queue_marks_wait_precisely(const at::Device& device) { return device.is_cuda(); }

QueueMark QueueMark::after_queued_work(const at::Device& device) {
  QueueMark mark;
  if (!device.is_cuda()) return mark;
  mark.event_ = std::make_shared<Event>();
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  mark.event_->event.record(c10::cuda::getCurrentCUDAStream(index));
  return mark;
}

void QueueMark::wait() const {
  if (event_) event_->event.synchronize();
}
#else
// A libtorch without the CUDA runtime's headers here: a mark on a GPU can
// only wait for the whole device.
struct QueueMark::Event {
  at::Device device;
};

bool queue_marks_wait_precisely(const at::Device&) { return false; }

QueueMark QueueMark::after_queued_work(const at::Device& device) {
  QueueMark mark;
  if (!device.is_cpu()) mark.event_ = std::make_shared<Event>(Event{device});
  return mark;
}

void QueueMark::wait() const {
  if (event_) synchronize_device(event_->device);
}
#endif

}  // namespace chiar::engine
