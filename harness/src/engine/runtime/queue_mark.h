#pragma once
// A point in a device's queue of work that the host can wait for without
// waiting for the work queued after it. On a GPU it is an event recorded on
// the current stream; on the CPU, whose work is done by the time it is
// queued, it is reached when it is made.
#include <memory>

#include <c10/core/Device.h>

namespace chiar::engine {

// Whether marks on `device` wait for part of its queue: true on a GPU in a
// build that compiles against the CUDA runtime (CHIAR_TORCH_CUDA), where
// otherwise waiting for a mark would mean waiting for the whole device.
bool queue_marks_wait_precisely(const at::Device& device);

class QueueMark {
 public:
  // Marks the current stream of `device` after the work queued on it so far.
  static QueueMark after_queued_work(const at::Device& device);

  // Blocks until the device has done the work queued before the mark;
  // what was queued after it may still be running.
  void wait() const;

 private:
  struct Event;
  std::shared_ptr<Event> event_;  // null on the CPU
};

}  // namespace chiar::engine
