#pragma once
// Quality at equal training time. A variant that is cheaper per step has
// also seen fewer steps' worth of wall-clock when the budgets are equal in
// steps; this asks the other question: how good is each variant after the
// same seconds of training?
#include <string>
#include <utility>
#include <vector>

#include "report.h"

namespace chiar::report {

struct EqualTimeTable {
  std::string task;
  double seconds = 0;      // the common training time, T*
  std::string limited_by;  // the variant whose curve ends first (at T*)
  Table table;
};

// Per task with at least two variants that have learning curves: T* is the
// shortest of the variants' mean times to their last comparable validation
// (RunRow::valid_curve), a run's time at a validation being its step times
// its variant's step time, VariantSummary::step_ms (evaluation and
// checkpoints excluded; time spent on them is the same work for every
// variant). A variant's runs do the same work per step, so one clock serves
// them all; a run's own would carry whatever else the machine ran while it
// trained (kDisturbedStepRatio). Each run's metric at T* is read
// off its curve by linear interpolation between validations; a run with no
// validation at or before T* gives none, and one whose curve ends before T*
// gives its last value.
std::vector<EqualTimeTable> equal_time_tables(const Summary& s);

}  // namespace chiar::report
