// The environment contract between the agent (which writes these variables
// into every worker's environment) and the worker library (which reads them).
// One list, so the writer and the reader cannot drift apart. The torchrun names
// keep torchrun's meaning; the DDP_* names are ddprun's own.
#pragma once

namespace ddp::env_names {

// torchrun's worker environment.
inline constexpr const char* kLocalRank = "LOCAL_RANK";
inline constexpr const char* kRank = "RANK";
inline constexpr const char* kGroupRank = "GROUP_RANK";
inline constexpr const char* kRoleRank = "ROLE_RANK";
inline constexpr const char* kRoleName = "ROLE_NAME";
inline constexpr const char* kLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr const char* kWorldSize = "WORLD_SIZE";
inline constexpr const char* kGroupWorldSize = "GROUP_WORLD_SIZE";
inline constexpr const char* kRoleWorldSize = "ROLE_WORLD_SIZE";
inline constexpr const char* kMasterAddr = "MASTER_ADDR";
inline constexpr const char* kMasterPort = "MASTER_PORT";
inline constexpr const char* kRestartCount = "TORCHELASTIC_RESTART_COUNT";
inline constexpr const char* kMaxRestarts = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr const char* kRunId = "TORCHELASTIC_RUN_ID";
inline constexpr const char* kUseAgentStore = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr const char* kErrorFile = "TORCHELASTIC_ERROR_FILE";
// torch 1.13's name and torch 2.x's (which 2.x's agent sets; 2.x still reads
// the old one, with a deprecation warning): ddprun sets both.
inline constexpr const char* kNcclAsyncErrorHandling = "NCCL_ASYNC_ERROR_HANDLING";
inline constexpr const char* kTorchNcclAsyncErrorHandling = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
// The devices CUDA shows a worker (--virtual_local_rank sets it per worker).
inline constexpr const char* kCudaVisibleDevices = "CUDA_VISIBLE_DEVICES";
inline constexpr const char* kOmpNumThreads = "OMP_NUM_THREADS";
// Python's module path: ddprun appends the folder of its own Python modules
// (<prefix>/lib/ddprun/python, holding ddp_torch) after the user's entries,
// when that folder exists beside the ddprun executable.
inline constexpr const char* kPythonPath = "PYTHONPATH";

// ddprun's own: where the agents' store is, and the key prefix this round's
// workers own in it (a worker of an old round can never touch a new round's keys).
inline constexpr const char* kStoreAddr = "DDP_STORE_ADDR";
inline constexpr const char* kStorePort = "DDP_STORE_PORT";
inline constexpr const char* kStoreToken = "DDP_STORE_TOKEN";
inline constexpr const char* kStorePrefix = "DDP_STORE_PREFIX";
// Optional, read by the worker library only: the default collective timeout
// (seconds), and how Gloo finds this host's address.
inline constexpr const char* kTimeout = "DDP_TIMEOUT";
inline constexpr const char* kGlooSocketIfname = "GLOO_SOCKET_IFNAME";
inline constexpr const char* kGlooHostname = "DDP_GLOO_HOSTNAME";
// Optional, read by the torch backend "ddp" (torch_backend/): "0" turns off the
// check, before every collective, that the ranks agree on its op, size, dtype
// and root (one small exchange per collective).
inline constexpr const char* kTorchCheck = "DDP_TORCH_CHECK";
// The descriptor of this worker's progress page (ddp/worker_contract/progress_page.h),
// inherited from the agent; unset when the agent does not watch progress.
inline constexpr const char* kProgressFd = "DDP_PROGRESS_FD";
// The worker's end of its control channel (ddp/worker_contract/control_channel.h),
// inherited from the agent; unset for an agent that does not offer one.
inline constexpr const char* kControlFd = "DDP_CONTROL_FD";
// How long (milliseconds) a worker that recovers in place lets a failed
// collective wait for the agent's word that the round ended (a node's death
// reaches its peers' connections before the agents' verdict).
inline constexpr const char* kChangeGraceMs = "DDP_CHANGE_GRACE_MS";
// The job's restarts and membership changes so far, counted once per round
// across every node (TORCHELASTIC_RESTART_COUNT keeps torchrun's meaning:
// the restarts of this node's agent, which a node that joined late started
// at zero).
inline constexpr const char* kJobRestartCount = "DDP_JOB_RESTART_COUNT";
inline constexpr const char* kMembershipChanges = "DDP_MEMBERSHIP_CHANGES";

}  // namespace ddp::env_names
