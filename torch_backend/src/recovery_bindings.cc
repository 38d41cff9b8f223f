// In-place recovery's part of ddp_torch._C: ddp::in_place (ddp/worker/recovery.h)
// for ddp_torch/recovery.py, and ddp::GroupChanged as ddp_torch.GroupChanged.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <fmt/format.h>

#include "bindings.h"
#include "ddp/common/error.h"
#include "ddp/worker/recovery.h"

namespace ddp::torch_backend {
namespace {

namespace py = pybind11;

// "round 3", or the round this worker started in while its number is unknown.
std::string round_name(int number) {
  return number < 0 ? std::string("the round this worker started in")
                    : fmt::format("round {}", number);
}

// GroupChanged's message in Python: the round that ended, and ddp's words
// (which carry the agent's).
std::string group_changed_message(const std::string& what) {
  const in_place::RoundNow now = in_place::current_round();
  return fmt::format("{} ended: {}", round_name(now.number), what);
}

py::dict round_to_dict(const contract::WorkerRound& round) {
  py::dict facts;
  facts["round"] = round.round;
  facts["rank"] = round.rank;
  facts["world_size"] = round.world_size;
  facts["local_rank"] = round.local_rank;
  facts["local_world_size"] = round.local_world_size;
  facts["group_rank"] = round.group_rank;
  facts["group_world_size"] = round.group_world_size;
  facts["restart_count"] = round.restart_count;
  facts["master_addr"] = round.master_addr;
  facts["master_port"] = round.master_port;
  facts["environment"] = contract::environment_of(round);
  return facts;
}

// ddp_torch.GroupChanged; never destroyed: Python may raise it until the interpreter ends.
py::exception<GroupChanged>* group_changed_type = nullptr;

}  // namespace

void bind_recovery(py::module_& module) {
  group_changed_type = new py::exception<GroupChanged>(module, "GroupChanged", PyExc_RuntimeError);
  group_changed_type->doc() =
      "The round this worker was in ended (a node was lost or joined, a worker elsewhere "
      "restarted): the collective did not complete. Call ddp_torch.reform().";
  // Every binding that throws ddp::GroupChanged (this module's, and torch's
  // own, Work.wait() among them, when they share pybind11's registry) raises it.
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const GroupChanged& e) {
      PyErr_SetString(group_changed_type->ptr(), group_changed_message(e.what()).c_str());
    }
  });

  module.def("open_control_channel", &in_place::open,
             "Opens the agent's control channel and says hello (in place); False when there is "
             "none (not under ddprun). Once per process.");
  module.def("recovers_in_place", &in_place::is_open,
             "Whether the agent's control channel is open");
  module.def(
      "current_round",
      [] {
        const in_place::RoundNow now = in_place::current_round();
        return py::make_tuple(now.generation, now.number, now.ended, now.why);
      },
      "(generation, number, ended, why) of the round this worker is in");
  module.def(
      "round_ends_within_grace",
      [] {
        auto explain = in_place::failure_explainer();
        if (!explain) return false;
        std::exception_ptr explained;
        {
          py::gil_scoped_release released;
          explained = explain(std::make_exception_ptr(std::runtime_error("a step failed")));
        }
        try {
          std::rethrow_exception(explained);
        } catch (const GroupChanged&) {
          return true;
        } catch (...) {
          return false;
        }
      },
      "Waits up to the round's grace for the agent's word that the current round ended "
      "(a peer's death breaks connections first); whether it ended");
  module.def(
      "round_name", [](int generation) { return round_name(in_place::round_number(generation)); },
      py::arg("generation"), "'round N' for a generation, as error messages name it");
  module.def(
      "wait_next_round",
      [](std::chrono::milliseconds timeout) {
        contract::WorkerRound round;
        {
          py::gil_scoped_release released;
          round = in_place::wait_next_round(timeout);
        }
        return round_to_dict(round);
      },
      py::arg("timeout"),
      "Waits for the agent's next round; a dict of its facts and 'environment' (name, value) "
      "pairs");
  module.def(
      "report_reformed",
      [](int round_number, int rank, double wait_seconds, double build_seconds) {
        contract::WorkerRound round;
        round.round = round_number;
        round.rank = rank;
        return in_place::report_reformed(round, wait_seconds, build_seconds);
      },
      py::arg("round"), py::arg("rank"), py::arg("wait_seconds"), py::arg("build_seconds"),
      "Tells the agent this worker re-formed for the round");
}

}  // namespace ddp::torch_backend
