#include "ddp/agent/worker_spec.h"

#include <sstream>

#include "ddp/common/error.h"
#include "ddp/worker_contract/env_names.h"

namespace ddp::agent {
namespace {

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// The value of `name`, else of `other`, else "1".
std::string either_or_one(const std::map<std::string, std::string>& env, const char* name,
                          const char* other) {
  for (const char* key : {name, other}) {
    auto it = env.find(key);
    if (it != env.end()) return it->second;
  }
  return "1";
}

// torch's _set_local_rank_env: the local_rank-th device of `visible`.
std::string own_device(const std::string& visible, int local_rank) {
  const std::vector<std::string> items = visible_device_items(visible);
  if (local_rank >= static_cast<int>(items.size())) {
    throw InvalidArgument("--virtual_local_rank",
                          "local rank " + std::to_string(local_rank) +
                              " has no device in CUDA_VISIBLE_DEVICES=" + visible);
  }
  return items[static_cast<std::size_t>(local_rank)];
}

}  // namespace

std::vector<std::string> visible_device_items(const std::string& visible) {
  std::vector<std::string> items;
  std::istringstream in(visible);
  for (std::string item; std::getline(in, item, ',');) items.push_back(item);
  if (visible.empty() || visible.back() == ',') items.emplace_back();
  for (auto& item : items) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
  }
  return items;
}

void add_torch_variables(std::map<std::string, std::string>& env, const TorchWorkerFacts& facts) {
  namespace names = env_names;
  env[names::kUseAgentStore] = facts.uses_agent_store ? "True" : "False";
  const std::string torch_name =
      either_or_one(env, names::kTorchNcclAsyncErrorHandling, names::kNcclAsyncErrorHandling);
  const std::string old_name =
      either_or_one(env, names::kNcclAsyncErrorHandling, names::kTorchNcclAsyncErrorHandling);
  env[names::kTorchNcclAsyncErrorHandling] = torch_name;
  env[names::kNcclAsyncErrorHandling] = old_name;
  if (facts.set_omp_num_threads && env.find(names::kOmpNumThreads) == env.end()) {
    // insert_or_assign of a std::string: GCC 12 at -O3 warns (-Wrestrict, a
    // false positive) of a literal assigned into a map's string here.
    env.insert_or_assign(names::kOmpNumThreads, std::string("1"));
  }
  if (facts.virtual_local_rank) {
    auto visible = env.find(names::kCudaVisibleDevices);
    env[names::kCudaVisibleDevices] = visible == env.end()
                                          ? std::to_string(facts.local_rank)
                                          : own_device(visible->second, facts.local_rank);
    env.insert_or_assign(names::kLocalRank, std::string("0"));
  }
}

std::string substitute_local_rank(const std::string& arg, int local_rank) {
  return replace_all(arg, "${local_rank}", std::to_string(local_rank));
}

std::string format_line_prefix(const std::string& tmpl, const std::string& role, int local_rank,
                               int rank) {
  std::string out = replace_all(tmpl, "${role_name}", role);
  out = replace_all(out, "${local_rank}", std::to_string(local_rank));
  return replace_all(out, "${rank}", std::to_string(rank));
}

}  // namespace ddp::agent
