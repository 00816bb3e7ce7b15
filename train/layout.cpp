// The composition root of a parallel run: the layout checked against the model, the process
// groups built and handed to the model and the DataParallel. See layout.h.
#include "train/layout.h"

#include "core/error.h"
#include "model/context_parallel.h"
#include "model/split.h"
#include "parallel/comm_device.h"

namespace trex::train {

void validate_layout(const parallel::ParallelDims& dims, int world_size, const model::ModelConfig& cfg) {
  dims.validate_world(world_size);
  model::check_split(cfg, {dims.tp, dims.ep, dims.pp, dims.pp_layers});
  model::check_context_parallel(dims.cp);
}

ParallelRun make_parallel_run(parallel::Communicator& world, const parallel::ParallelDims& dims, model::Model& m,
                              AdamWConfig ocfg, DpOptions o) {
  TREX_CHECK(world.size() == dims.world(), "make_parallel_run: ", dims.str(), " on ", world.size(), " ranks");
  ParallelRun r;
  if (world.size() == 1) return r;
  if (m.on_device()) {  // plain data parallelism, its gradients and parameters moved by the device's communicator
    const std::string dev = m.backend().name();
    TREX_USER_CHECK(dims.tp == 1 && dims.pp == 1 && dims.ep == 1 && dims.cp == 1,
                    "set parallel.tp, parallel.pp, parallel.ep and parallel.cp to 1 (data parallelism only) on device "
                    "\"" + dev + "\", or train on device \"cpu\"",
                    "parallel.ep = ", dims.ep, ", parallel.tp = ", dims.tp, ", parallel.pp = ", dims.pp,
                    ", parallel.cp = ", dims.cp, ": expert, tensor, pipeline and context parallelism do not run on the ",
                    dev, " backend yet");
    TREX_USER_CHECK(o.zero_stage == 1, "set parallel.zero_stage = 1 on device \"" + dev + "\"",
                    "parallel.zero_stage = ", o.zero_stage, ": sharded gradients (ZeRO-2) do not run on the ", dev,
                    " backend yet");
    r.device = parallel::make_device_comm(world, m.backend());
    o.device_comm = r.device.get();
  }
  r.groups = parallel::make_process_groups(world, dims);
  if (dims.ep > 1) m.set_expert_parallel(r.groups.ep.get());
  if (dims.tp > 1) m.set_tensor_parallel(r.groups.tp.get(), o.sequence_parallel);
  if (dims.cp > 1) m.set_context_parallel(r.groups.cp.get());
  if (dims.pp > 1) {
    const int s = dims.coord(world.rank()).pp;
    const int64_t L = m.cfg.num_hidden_layers, l0 = dims.stage_first_layer(L, s);
    m.set_pipeline_stage({l0, l0 + dims.stage_layers(L)[s], s == 0, s == dims.pp - 1});
  }
  o.tp = dims.tp;
  o.cp = dims.cp;
  o.pp = dims.pp;
  o.pp_comm = dims.pp > 1 ? r.groups.pp.get() : nullptr;
  const model::ParamLayout& ml = m.layout;
  if (ml.stage_sharded()) {  // every tensor reduced over the ranks holding it
    TREX_CHECK(dims.pp > 1, "make_parallel_run: a stage-sharded model needs parallel.pp > 1");
    r.stage = world.group(dims.stage_group(world.rank()));
    o.stage_comm = r.stage.get();
    if (model::embedding_shared(m.cfg, ml.stage)) {
      const int s = dims.coord(world.rank()).pp;
      r.shared = world.split(s == 0 || s == dims.pp - 1 ? 0 : -1, world.rank());
      o.shared_comm = r.shared.get();
    }
  }
  if (ml.tp_sharded()) {
    TREX_CHECK(dims.tp == ml.tp.size, "make_parallel_run: a model holding tp slice ", ml.tp.rank, " of ", ml.tp.size,
               " needs parallel.tp = ", ml.tp.size);
    r.tp_slice = world.group(ml.stage_sharded() ? dims.stage_tp_slice_group(world.rank()) : dims.tp_slice_group(world.rank()));
    o.tp_slice_comm = r.tp_slice.get();
  }
  if (ml.expert_sharded()) {
    TREX_CHECK(dims.ep > 1, "make_parallel_run: an expert-sharded model needs parallel.ep > 1");
    r.expert_replicas = world.group(ml.stage_sharded() ? dims.stage_expert_group(world.rank())
                                                       : dims.expert_replica_group(world.rank()));
    o.expert_comm = r.expert_replicas.get();
  }
  // The DataParallel runs over the whole world (rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp *
  // pp_rank))).
  r.dp = std::make_unique<DataParallel>(world, m, ocfg, o);
  return r;
}

}  // namespace trex::train
