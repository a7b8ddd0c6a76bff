#pragma once
// Named crash points for the fault-injection tests (tests/test_faults.cpp).
// CHIAR_FAILPOINT=NAME:N makes the process kill itself with SIGKILL the N-th
// time (1-based) it reaches failpoint(NAME): a crash at an exact moment
// (between a checkpoint's write and its rename, inside a store commit) that
// a signal sent from outside would hit only by chance. NAME:N:term sends
// SIGTERM instead (a stop request, as from scancel or Ctrl-C); NAME:N:oom
// throws the c10::OutOfMemoryError that libtorch's CUDA allocator throws when
// a device is full (an out-of-memory failure on a machine without one), and
// NAME:N:throw a std::runtime_error (a run that fails, once). Targets joined
// by commas act independently, each counting its own passes, in the order
// given when several fall on one pass (train.step:4:term,train.step:4:throw:
// a stop requested as the run fails). Unset, a failpoint costs a look at an
// empty list.
namespace chiar::engine {

// The points the harness has, in the order a run reaches them.
//   train.step           after a training step's optimiser update
//   eval.batch           after each batch of an evaluation (validation or test)
//   eval.scored          after a validation pass, before its metrics are stored
//   checkpoint.written   a checkpoint's temporary file is fsynced, not yet renamed
//   checkpoint.renamed   renamed into place, not yet recorded in the store
//   store.commit         inside a store transaction, before COMMIT
void failpoint(const char* name);

}  // namespace chiar::engine
