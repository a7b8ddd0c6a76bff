#pragma once
// SIGPIPE blocked in the calling thread while a SigpipeBlock lives, and so in
// every thread started meanwhile. Gloo writes to its sockets with writev,
// which raises SIGPIPE when a peer has died, and SIGPIPE's default ends the
// process before Gloo can report the error (Python hides this by ignoring
// SIGPIPE process-wide). A SIGPIPE raised in a blocked thread stays pending
// there while the write fails with EPIPE, which Gloo reports. The pending
// signal must not outlive the block in the thread that held it: restoring
// the mask would deliver it and end the process with no message. So the
// destructor takes it first (unless the thread had SIGPIPE blocked before).
#include <signal.h>

#include <ctime>

namespace chiar::engine {

class SigpipeBlock {
 public:
  SigpipeBlock() { pthread_sigmask(SIG_BLOCK, &pipe_, &saved_); }
  ~SigpipeBlock() {
    if (!sigismember(&saved_, SIGPIPE)) {
      const timespec now{0, 0};
      while (sigtimedwait(&pipe_, nullptr, &now) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  static sigset_t only_sigpipe() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    return set;
  }
  const sigset_t pipe_ = only_sigpipe();
  sigset_t saved_{};
};

}  // namespace chiar::engine
