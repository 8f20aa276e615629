// The coordinator's durable state: one SQLite database (Debian's libsqlite3) holding every
// job as a `ringmaster.Job` proto (spec, phase, epoch, members, restarts, recoveries,
// checkpoints) in submission order.
//
// Durability: WAL journal with synchronous=FULL, so a Put that returned is on disk: a
// coordinator killed with SIGKILL (or a machine losing power) finds it after restart. A
// Put either lands whole or not at all (one transaction). The service persists a decision
// here before it announces it (coordinator/membership.h's PersistJob actions).
//
// One process owns the database: Open takes an exclusive lock (locking_mode=EXCLUSIVE), so
// a second coordinator on the same file fails with FAILED_PRECONDITION instead of
// corrupting it.
//
// The database and its WAL are created with mode 0600 (they hold the membership secret);
// an existing database that others can read is made 0600 on Open.
//
// Thread-safe: calls are serialised internally.
#ifndef RINGMASTER_COORDINATOR_JOB_STORE_H_
#define RINGMASTER_COORDINATOR_JOB_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/coordinator.pb.h"

struct sqlite3;

namespace ringmaster::coordinator {

struct JobStoreOptions {
  // Makes an existing file that is empty or lacks ringmaster's tables a new, empty job
  // database (ringmaster --fresh_db) instead of refusing it. Every job it held and the
  // membership secret are forgotten: running agents and trainers are locked out.
  bool start_fresh = false;
};

class JobStore {
 public:
  // Opens the database at `path`, creating it (and its directory) when no file is there.
  // An existing file (or a WAL left without its database) that is empty, or lacks
  // ringmaster's tables, is refused unless options.start_fresh: a truncated or replaced
  // database must not silently become a fresh cluster with no jobs and a new secret.
  // Errors: INVALID_ARGUMENT for an empty path; FAILED_PRECONDITION when another process
  // holds the database, or the file is not a ringmaster database, or is empty (names the
  // file and --fresh_db); INTERNAL with SQLite's message otherwise.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(
      const std::string& path, const JobStoreOptions& options = JobStoreOptions());
  ~JobStore();

  // Inserts or replaces the job (keyed by job.id(); a new id goes last in submission order).
  absl::Status Put(const Job& job);
  // Removes the job; NOT_FOUND when absent.
  absl::Status Delete(const std::string& id);
  // Every job, in submission order. DATA_LOSS names a row that does not parse.
  absl::StatusOr<std::vector<Job>> LoadAll();
  // NOT_FOUND when absent.
  absl::StatusOr<Job> Get(const std::string& id);
  // The value of a setting; when absent, stores `initial` first and returns it.
  absl::StatusOr<std::string> GetOrCreateSetting(const std::string& key,
                                                 const std::string& initial);

  const std::string& path() const { return path_; }

 private:
  JobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when the database has ringmaster's tables, or options.start_fresh (saying so).
  absl::Status CheckTables(const JobStoreOptions& options) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  const std::string path_;
};

}  // namespace ringmaster::coordinator

#endif  // RINGMASTER_COORDINATOR_JOB_STORE_H_
