#include "client/coordinator_store.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ringmaster::client {

absl::Status CoordinatorStore::Set(absl::string_view key, absl::string_view value) {
  RM_RETURN_IF_ERROR(comm::ValidateStoreKey(key));
  StoreSetRequest request;
  request.set_job(job_);
  *request.mutable_slot() = slot_;
  request.set_epoch(epoch_);
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  return client_->StoreSet(request);
}

absl::StatusOr<std::string> CoordinatorStore::Get(absl::string_view key, absl::Time deadline) {
  RM_RETURN_IF_ERROR(comm::ValidateStoreKey(key));
  StoreGetRequest request;
  request.set_job(job_);
  *request.mutable_slot() = slot_;
  request.set_epoch(epoch_);
  request.add_keys(std::string(key));
  RM_ASSIGN_OR_RETURN(StoreGetResponse response, client_->StoreGet(request, deadline));
  if (response.values_size() != 1) {
    return absl::InternalError(absl::StrCat("the coordinator returned ", response.values_size(),
                                            " values for one key"));
  }
  return response.values(0);
}

absl::Status CoordinatorStore::Wait(const std::vector<std::string>& keys, absl::Time deadline) {
  if (keys.empty()) return absl::OkStatus();
  StoreGetRequest request;
  request.set_job(job_);
  *request.mutable_slot() = slot_;
  request.set_epoch(epoch_);
  for (const std::string& key : keys) {
    RM_RETURN_IF_ERROR(comm::ValidateStoreKey(key));
    request.add_keys(key);
  }
  return client_->StoreGet(request, deadline).status();
}

absl::StatusOr<int64_t> CoordinatorStore::Add(absl::string_view key, int64_t delta) {
  RM_RETURN_IF_ERROR(comm::ValidateStoreKey(key));
  StoreAddRequest request;
  request.set_job(job_);
  *request.mutable_slot() = slot_;
  request.set_epoch(epoch_);
  request.set_key(std::string(key));
  request.set_delta(delta);
  RM_ASSIGN_OR_RETURN(StoreAddResponse response, client_->StoreAdd(request));
  return response.value();
}

}  // namespace ringmaster::client
