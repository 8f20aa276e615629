#include "worker/inprocess_world.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace ringmaster::worker {

nlohmann::json WorldMessage(const CommandEnvInput& in) {
  const CommandPlacement& p = in.placement;
  return {{"type", "world"},
          {"epoch", in.epoch},
          {"rank", p.rank},
          {"world_size", p.world_size},
          {"local_rank", p.local_rank},
          {"local_world_size", p.local_world_size},
          {"group_rank", p.group_rank},
          {"group_world_size", p.group_world_size},
          {"master_addr", in.master_addr},
          {"master_port", in.master_port},
          {"restart_count", in.restart_count},
          {"reason", in.restart_reason}};
}

absl::Status InProcessWorld::SetWorld(const CommandEnvInput& input, ProgramChannel* channel) {
  world_ = WorldMessage(input);
  if (!opted_in_) return absl::OkStatus();  // its hello brings the world
  return Send(channel);
}

void InProcessWorld::Take(const nlohmann::json& message, ProgramChannel* channel) {
  const std::string type = message.value("type", "");
  if (type == "hello") {
    opted_in_ = message.value("inprocess", false);
    if (opted_in_ && world_.has_value()) {
      if (absl::Status s = Send(channel); !s.ok()) {
        LOG(WARNING) << "cannot send the program its world: " << s;
      }
    }
  } else if (type == "world_done") {
    const auto epoch = message.find("epoch");
    if (epoch != message.end() && epoch->is_number_integer()) {
      world_done_ = epoch->get<int64_t>();
      LOG(INFO) << "the program built its process group for epoch " << world_done_;
    }
  }
}

void InProcessWorld::ProgramGone() {
  world_.reset();  // a new program must not get the world its predecessor failed in
  opted_in_ = false;
  world_done_ = 0;
  world_sent_ = 0;
}

absl::Status InProcessWorld::Send(ProgramChannel* channel) {
  if (channel == nullptr) return absl::FailedPreconditionError("the program has no channel");
  const int64_t epoch = (*world_)["epoch"].get<int64_t>();
  if (epoch == world_sent_) return absl::OkStatus();
  if (absl::Status s = channel->Send(*world_); !s.ok()) return s;
  world_sent_ = epoch;
  LOG(INFO) << "sent the program the world of epoch " << epoch << " (rank "
            << (*world_)["rank"] << " of " << (*world_)["world_size"] << ")";
  return absl::OkStatus();
}

}  // namespace ringmaster::worker
