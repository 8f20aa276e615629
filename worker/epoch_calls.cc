#include "worker/epoch_calls.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ringmaster::worker {

absl::StatusOr<int64_t> NextEpoch(const EpochCaller& caller, int64_t epoch,
                                  absl::Duration timeout, Clock* clock) {
  const absl::Time give_up = clock->Now() + timeout;
  while (true) {
    ProgressRequest request;
    request.set_job(caller.job);
    request.set_epoch(epoch);
    *request.mutable_slot() = caller.slot;
    request.mutable_stats()->set_step(-1);
    auto response = caller.client->Progress(request);
    if (!response.ok() && !absl::IsNotFound(response.status())) return response.status();
    if (response.ok() && response->epoch() > epoch) return response->epoch();
    const absl::Time now = clock->Now();
    if (now >= give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no epoch after ", epoch, " formed within ", absl::FormatDuration(timeout)));
    }
    clock->SleepUntil(now + absl::Milliseconds(100));
  }
}

void ReportEpochError(const EpochCaller& caller, int64_t epoch, const absl::Status& error,
                      const ringmaster::RankFailure* failure) {
  ReportErrorRequest request;
  request.set_job(caller.job);
  request.set_epoch(epoch);
  *request.mutable_slot() = caller.slot;
  request.set_detail(error.ToString(absl::StatusToStringMode::kWithNoExtraData));
  request.set_permanent(IsPermanent(error));
  request.set_node_local(IsNodeLocal(error));
  if (failure != nullptr) *request.mutable_failure() = *failure;
  absl::Status s = caller.client->ReportError(request);
  if (!s.ok() && !absl::IsAborted(s)) LOG(WARNING) << "reporting the error failed: " << s;
}

}  // namespace ringmaster::worker
