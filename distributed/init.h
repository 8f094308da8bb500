// init_process_group: joins this process to a job, as torch.distributed.init_process_group.
//
//   auto group = distributed::init_process_group();          // env://: RANK, WORLD_SIZE,
//                                                             // MASTER_ADDR, MASTER_PORT (chorusrun sets them)
//   auto evens = distributed::new_group({0, 2});             // every rank calls it, in the same order
//
// Rank 0 hosts a TCPStore at MASTER_ADDR:MASTER_PORT; every rank connects to it, and the backend's
// rendezvous runs through it. With CHORUS_DISTRIBUTED_DEBUG=DETAIL every group is wrapped in
// ProcessGroupDebug, which checks before each collective that all ranks call the same one. A job of
// several processes whose TCPStore init_process_group made also gets heartbeats (heartbeat.h): a
// rank that stops is named within CHORUS_HEARTBEAT_S x CHORUS_HEARTBEAT_MISSES seconds (5 x 3 by
// default) and the job ends (exit code 75), instead of waiting for a collective's timeout. With a
// job token in the environment (CHORUS_JOB_TOKEN_FILE or CHORUS_JOB_TOKEN, job_token.h; chorusrun
// sets it), the store lets in only the job's processes (store_auth.h).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "distributed/store.h"

namespace chorus::distributed {

struct InitOptions {
  // "gloo" (CPU tensors; sim and CUDA tensors through Gloo on the communication stream), "nccl"
  // (CUDA tensors through NCCL, CPU tensors through Gloo; link //distributed:nccl), or explicit
  // device:backend pairs as PyTorch's, e.g. "cpu:gloo,cuda:nccl" or "cpu:gloo,sim:gloo".
  std::string backend = "gloo";
  // "env://" (default): rank, world size and the store address come from the environment.
  // "tcp://host:port": the store address is given; rank and world_size below (or RANK/WORLD_SIZE).
  // "file:///path": a FileStore at path (one machine or a shared file system).
  std::string init_method = "env://";
  int rank = -1;        // -1: from RANK
  int world_size = -1;  // -1: from WORLD_SIZE
  // Timeout of the rendezvous and of every collective on the groups created (per collective). Left
  // at this default, the environment variable CHORUS_TIMEOUT_S (seconds) replaces it.
  std::chrono::milliseconds timeout{300000};
  // A store made by the caller replaces init_method's.
  std::shared_ptr<Store> store{};
};

// Creates the default group. Missing or malformed environment variables, a rank outside
// [0, world_size), an unknown backend, or a second call without destroy_process_group() ->
// chorus::Error saying which and what was expected.
std::shared_ptr<ProcessGroup> init_process_group(InitOptions options = {});
bool is_initialized();
// The default group; chorus::Error when init_process_group() has not run.
std::shared_ptr<ProcessGroup> default_group();
int get_rank();
int get_world_size();
// The store the default group rendezvoused through (e.g. for a job's own keys).
std::shared_ptr<Store> default_store();
// Drops the default group (its worker thread stops once no one else holds it).
void destroy_process_group();

// A group of the given ranks of the default group (sorted, unique, each in range). Every rank of
// the default group must call it, in the same order, as in PyTorch; ranks outside `ranks` get a
// nullptr. Within the new group, ranks are renumbered 0..n-1 in ascending order of their global rank.
std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks,
                                        std::optional<std::chrono::milliseconds> timeout = std::nullopt);

// A backend spec, parsed: the device backend for each device type (CPU tensors always use Gloo).
// chorus::Error naming the spec and what is expected when malformed.
struct BackendSpec {
  std::vector<std::pair<DeviceType, std::string>> devices;
};
BackendSpec parse_backend(const std::string& spec);

// Makes the communicator of a device backend other than "gloo" (e.g. "nccl", registered by linking
// //distributed:nccl): store for its rendezvous, rank, size, per-collective timeout.
class Communicator;
using DeviceBackendFactory = std::function<std::shared_ptr<Communicator>(std::shared_ptr<Store> store, int rank,
                                                                         int size, std::chrono::milliseconds timeout)>;
void register_device_backend(const std::string& name, DeviceBackendFactory factory);
// Whether a device backend of that name is registered in this process ("gloo" always is).
bool has_device_backend(const std::string& name);

// Reads an environment variable as an integer; chorus::Error naming it when missing or malformed.
int env_int(const char* name);

// Where this process sits in the job, from the environment of the launcher that started it:
// chorusrun/torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) first; without RANK and
// WORLD_SIZE, Open MPI's mpirun (OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK) or SLURM's srun
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the master is the first host of SLURM_JOB_NODELIST).
// Under a scheduler MASTER_PORT defaults to 29500 (torchrun's); MASTER_ADDR must be set for mpirun
// outside SLURM (`mpirun -x MASTER_ADDR=host`). Values are parsed strictly: a malformed one is a
// chorus::Error naming the variable.
struct LaunchEnv {
  std::string launcher;  // "env" (RANK/WORLD_SIZE), "openmpi", "slurm", or "" (none: a single process)
  int rank = -1, world_size = -1, local_rank = -1;  // -1: not given
  std::string master_addr;                          // empty: not given
  int master_port = -1;
  std::string rank_variable, world_size_variable;   // where rank and world size came from (messages)
};
LaunchEnv launch_env();
// The same from any lookup (tests pass a map).
LaunchEnv launch_env_from(const std::function<const char*(const char*)>& lookup);
// The first host of a SLURM host list: "node[01-04,07],gpu5" -> "node01", "tux3,tux4" -> "tux3",
// "n[008-010]-ib" -> "n008-ib". chorus::Error for an empty or malformed list.
std::string slurm_first_host(const std::string& nodelist);

}  // namespace chorus::distributed
