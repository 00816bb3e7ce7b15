// What limits a planned step: each phase's time per step (busy, and the part on the critical
// path), the resource that bounds it, and the layout change that would help. Phases: dense GEMMs,
// expert GEMMs, attention core, memory-bound kernels (with the precision recipe's quantize
// traffic), recompute, expert all-to-all, TP collectives, pipeline transfers, pipeline bubble,
// data-parallel collectives, optimizer step. Also why one planned layout beats another.
#pragma once
#include <string>
#include <vector>
#include "plan/layout.h"
#include "plan/spec.h"
#include "plan/timing.h"

namespace trex::plan {

struct Limit {
  std::string phase;
  double busy = 0;     // seconds per step the phase occupies its resource
  double exposed = 0;  // seconds per step it adds to the step (not hidden behind other work)
  std::string bound_by, helps;
};

// Phases sorted by exposed time, largest first (phases of zero time left out).
std::vector<Limit> step_limits(const ClusterSpec& s, const Layout& l, const StepTime& t);

// One line: why layout `a` is faster per token than `b` (the step components that differ most,
// per token so that different batch sizes compare).
std::string why_faster(const Layout& la, const StepTime& a, const Layout& lb, const StepTime& b);

}  // namespace trex::plan
