#include "ddp/agent/worker_spec.h"

namespace ddp::agent {
namespace {

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

}  // namespace

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
