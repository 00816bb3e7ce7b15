// The device a run computes on (train.device, --device on train / grad / bench / generate):
// "cpu", "cuda" (the first CUDA device) or "cuda:N". The composition root creates the backend
// (kernels/backend.h) once and hands it to the model; everything below calls the backend.
#pragma once
#include <memory>
#include <string>
#include "kernels/backend.h"

namespace trex::train {

// Checks the spelling: "cpu", "cuda" or "cuda:N"; else a UserError naming `where`.
std::string parse_device(const std::string& s, const std::string& where);

// The device a rank of a parallel job uses: "cuda" becomes "cuda:L" when local_rank (the rank's
// index on its host, from the launcher: OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or
// SLURM_LOCALID) is a number L, so each rank of a host takes its own GPU; anything else is
// returned as it is ("cuda:N" names one device for every rank).
std::string rank_device(const std::string& device, const char* local_rank);

// Opens the backend of `device` (after rank_device with the launcher's local rank) before anything is loaded: null for "cpu" (a model computes on
// its own CPU backend), else the backend, to give to Model::use_backend and keep alive as long as
// the model. Refused with a UserError naming `where` and the reason: a build without CUDA, no
// CUDA device. (Whether a model runs on it is Model::use_backend's check.)
std::unique_ptr<kern::Backend> open_device(const std::string& device, const std::string& where);

}  // namespace trex::train
