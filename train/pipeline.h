// Pipeline parallel: the 1F1B schedule of one training step and the pipelined forward of an
// evaluation batch, over the pp group of one data rank (model::PipelineStage says which layers
// this rank runs).
//
// Each micro-batch crosses the stages as the activation between them (V3 [N, d], V4 the streams
// [N, hc_mult, d]), sent forward by stage s to s + 1 and its gradient sent back. Stage s of P runs
// min(P - s - 1, n) forwards (warm-up), then alternates one forward and one backward, then the
// remaining backwards (Megatron's 1F1B): it holds at most P - s micro-batches in flight.
//
// What a stage keeps between the forward and the backward of a micro-batch is its input only:
// the backward replays the stage's forward from it (Megatron's pipeline with full recompute), so
// the activation arena holds one micro-batch at a time. Cost: stages before the last run their
// layers' forward twice; the last stage runs the forward once, inside the backward.
//
// Sends are asynchronous and receives blocking; the schedule's dependencies form no cycle, so
// it cannot deadlock. Expert and tensor parallel collectives inside a stage are called in the
// same order by every rank of the stage, which all follow the same schedule.
#pragma once
#include <functional>
#include <vector>
#include "model/model.h"
#include "parallel/comm.h"

namespace trex::train {

// One training step's forward and backward over `micro` on this stage (pp.rank() = stage index,
// pp.size() = stages; every stage passes the same batches). Micro-batch k's gradient is scaled by
// scale[k]. before / after are called around every micro-batch's backward with whether it is the
// last one (the data-parallel bucket hook: DataParallel::begin_micro / end_micro). Returns this stage's loss parts per micro-batch (ce / mtp /
// n_valid from the last stage, 0 on the others; aux of this stage's layers). wait_ms: time
// blocked in the receives is added (the bubble and the transfers).
std::vector<model::LossParts> pipeline_step(model::Model& m, parallel::Communicator& pp,
                                            const std::vector<model::Batch>& micro, const std::vector<float>& scale,
                                            const std::function<void(bool last)>& before,
                                            const std::function<void(bool last)>& after, double* wait_ms);

// The forward of one batch through every stage (no gradients); the loss parts are the last
// stage's on the last stage, this stage's aux (and zeros) on the others.
model::LossParts pipeline_forward(model::Model& m, parallel::Communicator& pp, const model::Batch& b,
                                  double* wait_ms);

}  // namespace trex::train
