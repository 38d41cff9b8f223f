#include "job_record.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "safe_file.h"

namespace ddp::agent {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

// "2026-01-01T00:00:00.250Z".
std::string iso_time_ms(std::chrono::system_clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch());
  const std::time_t seconds = static_cast<std::time_t>(ms.count() / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char text[40];
  const std::size_t n = std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(text + n, sizeof(text) - n, ".%03dZ", static_cast<int>(ms.count() % 1000));
  return text;
}

std::string dump(const Json& doc) {
  return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// `status` (status_json's document) within `max` bytes: the longest lists
// emptied, in that order, and counted under "omitted".
std::string bounded_status(std::string status, std::size_t max) {
  if (status.size() <= max) return status;
  nlohmann::json doc = nlohmann::json::parse(status, nullptr, /*allow_exceptions=*/false);
  const std::size_t size = status.size();
  if (doc.is_object()) {
    for (const char* list : {"ranks", "members", "events"}) {
      if (!doc.contains(list) || !doc[list].is_array()) continue;
      doc["omitted"][list] = doc[list].size();
      doc[list] = nlohmann::json::array();
      status = doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      if (status.size() <= max) return status;
    }
  }
  // Past the limit even so: what the job came to, and why the rest is missing.
  nlohmann::json small = {
      {"kind", "agent"},
      {"omitted", "the whole document (" + std::to_string(size) + " bytes, over the limit of " +
                      std::to_string(max) + ")"}};
  for (const char* key : {"run_id", "state"}) {
    if (doc.is_object() && doc.contains(key) && doc[key].is_string()) small[key] = doc[key];
  }
  return small.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

// events.jsonl: the open file, its size, and where this node is.
class JobRecord::Lines {
 public:
  // `failed` hears of the first error (the file is given up then).
  Lines(std::string dir, std::string host, const Runtime& runtime, const Limits& limits,
        std::function<void(const std::string&, const std::string&)> failed)
      : path_(std::move(dir) + "/" + kEventsFile), host_(std::move(host)), runtime_(runtime),
        limits_(limits), failed_(std::move(failed)) {}
  ~Lines() { close(); }

  const std::string& path() const { return path_; }
  void at(const RoundFormed& round) {
    round_ = round.number;
    node_ = round.group_rank;
  }
  // `text` cut to the field limit.
  std::string cut(const std::string& text) const {
    if (text.size() <= limits_.field_bytes) return text;
    return text.substr(0, limits_.field_bytes) + "... [" +
           std::to_string(text.size() - limits_.field_bytes) + " bytes cut]";
  }

  // Appends one line: the stamp, `kind`, then `fields`.
  void write(const char* kind, const Json& fields) {
    if (given_up_) return;  // said once already
    Json line = {{"time", iso_time_ms(runtime_.wall_now())},
                 {"host", host_},
                 {"node", node_ >= 0 ? Json(node_) : Json(nullptr)},
                 {"round", round_ >= 0 ? Json(round_) : Json(nullptr)},
                 {"kind", kind}};
    for (auto it = fields.begin(); it != fields.end(); ++it) line[it.key()] = it.value();
    const std::string text = dump(line) + "\n";
    std::string error;
    if ((fd_ < 0 && !open(error)) ||
        (size_ > 0 && size_ + text.size() > limits_.events_bytes && !rotate(line, error))) {
      give_up(error);
      return;
    }
    if (!detail::write_all(fd_, text.data(), text.size())) {
      give_up(std::strerror(errno));
      return;
    }
    size_ += text.size();
    ++lines_;
  }

 private:
  bool open(std::string& error) {
    std::error_code ec;
    fs::create_directories(fs::path(path_).parent_path(), ec);
    fd_ = detail::open_no_symlinks(path_, O_WRONLY | O_CREAT | O_APPEND | O_NONBLOCK, 0644);
    if (fd_ < 0) {
      error = detail::open_error_text(errno);
      return false;
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      error = detail::file_type_text(st.st_mode) + " (refused)";
      return false;
    }
    size_ = static_cast<std::size_t>(st.st_size);
    return true;
  }

  // The full file becomes events.jsonl.1; a fresh one begins with a line
  // saying how many lines came before it.
  bool rotate(const Json& next, std::string& error) {
    close();
    const std::string rotated = fs::path(path_).parent_path() / kRotatedEventsFile;
    if (::rename(path_.c_str(), rotated.c_str()) != 0) {
      error =
          "cannot rename it to " + std::string(kRotatedEventsFile) + ": " + std::strerror(errno);
      return false;
    }
    if (!open(error)) return false;
    Json line = {{"time", next["time"]},          {"host", host_},     {"node", next["node"]},
                 {"round", next["round"]},        {"kind", "rotated"}, {"lines_before", lines_},
                 {"previous", kRotatedEventsFile}};
    const std::string text = dump(line) + "\n";
    if (!detail::write_all(fd_, text.data(), text.size())) {
      error = std::strerror(errno);
      return false;
    }
    size_ += text.size();
    return true;
  }

  void give_up(const std::string& error) {
    close();
    given_up_ = true;
    failed_(path_, error);
  }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  const std::string path_;
  const std::string host_;
  const Runtime& runtime_;
  const Limits limits_;
  const std::function<void(const std::string&, const std::string&)> failed_;
  int fd_ = -1;
  std::size_t size_ = 0;
  std::uint64_t lines_ = 0;  // written by this agent, every file
  int round_ = -1;
  int node_ = -1;
  bool given_up_ = false;
};

JobRecord::JobRecord(std::string dir, std::string host, const JobBoard& board,
                     std::function<void(const std::string&)> warn, Limits limits)
    : dir_(std::move(dir)), board_(board), warn_(std::move(warn)), limits_(limits) {
  if (!dir_.empty()) {
    lines_ = std::make_unique<Lines>(
        dir_, std::move(host), board_.runtime(), limits_,
        [this](const std::string& path, const std::string& reason) { failed(path, reason); });
  }
}

JobRecord::~JobRecord() = default;

void JobRecord::notice(const std::string& line) {
  if (lines_) lines_->write("notice", {{"text", lines_->cut(line)}});
}

void JobRecord::report(const std::string& text) {
  if (lines_) lines_->write("report", {{"text", lines_->cut(text)}});
}

void JobRecord::joining() {
  if (lines_) lines_->write("joining", Json::object());
}

void JobRecord::round_formed(const RoundFormed& r) {
  if (lines_) lines_->at(r);
  if (lines_)
    lines_->write("round_formed", {{"number", r.number},
                                   {"attempt", r.attempt},
                                   {"world_size", r.world_size},
                                   {"group_world_size", r.group_world_size},
                                   {"group_rank", r.group_rank},
                                   {"base_rank", r.base_rank},
                                   {"restarts_spent", r.job.restarts},
                                   {"membership_changes", r.job.membership_changes}});
}

void JobRecord::workers_running() {
  if (lines_) lines_->write("workers_running", Json::object());
}

void JobRecord::workers_stopping() {
  if (lines_) lines_->write("workers_stopping", Json::object());
}

void JobRecord::membership_changed(const MembershipChange& change) {
  if (!lines_) return;
  if (lines_)
    lines_->write(change.lost ? "node_lost" : "node_joined",
                  {{"member", change.node}, {"what", lines_->cut(change.what)}});
}

namespace {

Json worker_fields(const WorkerExit& exit) {
  return {{"rank", exit.rank},
          {"local_rank", exit.local_rank},
          {"pid", exit.pid},
          {"status", exit.status},
          {"reason", to_string(exit.reason)}};
}

}  // namespace

void JobRecord::worker_exited(const WorkerExit& exit) {
  if (lines_) lines_->write("worker_exited", worker_fields(exit));
}

void JobRecord::worker_failed(const WorkerExit& exit) {
  if (lines_) lines_->write("worker_failed", worker_fields(exit));
}

void JobRecord::restarting(const Restart& restart) {
  if (lines_)
    lines_->write("restarting", {{"cause", to_string(restart.cause)},
                                 {"restarts_spent", restart.job.restarts},
                                 {"membership_changes", restart.job.membership_changes},
                                 {"max_restarts", restart.max_restarts}});
}

void JobRecord::hang(const HangReport& hang) {
  if (!lines_) return;
  if (lines_)
    lines_->write("hang", {{"hang_kind", hang.hang_kind},
                           {"summary", lines_->cut(hang.summary)},
                           {"culprits", hang.culprits},
                           {"found_by", hang.node},
                           {"file", hang.file},
                           {"text", lines_->cut(hang.text)}});
}

void JobRecord::recovering(const std::string& why) {
  if (lines_) lines_->write("recovering", {{"why", lines_->cut(why)}});
}

void JobRecord::recovered(const std::string& line) {
  if (lines_) lines_->write("recovered", {{"text", lines_->cut(line)}});
}

void JobRecord::job_ended(int exit_code) {
  if (lines_) lines_->write("job_ended", {{"exit_code", exit_code}, {"succeeded", exit_code == 0}});
  write_status();
}

// status.json: written whole to a temporary file, synced, then renamed.
void JobRecord::write_status() {
  if (dir_.empty()) return;
  const Runtime& runtime = board_.runtime();
  const std::string doc =
      bounded_status(status_json(board_.snapshot(), runtime.now(),
                                 std::chrono::system_clock::to_time_t(runtime.wall_now())),
                     limits_.status_bytes) +
      "\n";
  const std::string path = dir_ + "/" + kStatusFile;
  const std::string temp = path + ".tmp";
  std::error_code ec;
  fs::create_directories(dir_, ec);
  const int fd = detail::open_no_symlinks(temp, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK, 0644);
  if (fd < 0) {
    failed(temp, detail::open_error_text(errno));
    return;
  }
  std::string error;
  if (!detail::write_all(fd, doc.data(), doc.size()) || ::fsync(fd) != 0) {
    error = std::strerror(errno);
  }
  ::close(fd);
  if (error.empty() && ::rename(temp.c_str(), path.c_str()) != 0) error = std::strerror(errno);
  if (!error.empty()) {
    ::unlink(temp.c_str());
    failed(path, error);
  }
}

void JobRecord::failed(const std::string& path, const std::string& reason) {
  if (warned_) return;
  warned_ = true;
  if (warn_) {
    warn_("cannot write the job's record (" + path + "): " + reason +
          "; the job goes on without it");
  }
}

}  // namespace ddp::agent
