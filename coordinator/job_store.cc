#include "coordinator/job_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ringmaster::coordinator {
namespace {

constexpr int kSchemaVersion = 1;

absl::Status SqliteError(sqlite3* db, absl::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " on ", path, ": ", db != nullptr ? sqlite3_errmsg(db) : "out of memory"));
}

// A failure while opening: another coordinator holding the lock, or not a database at all,
// are a person's to fix; anything else is SQLite's message.
absl::Status ExplainOpenError(sqlite3* db, const absl::Status& s, const std::string& path) {
  const int code = sqlite3_errcode(db);
  if (code == SQLITE_BUSY || code == SQLITE_LOCKED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job database ", path, " is in use by another coordinator; stop it first"));
  }
  if (code == SQLITE_NOTADB || code == SQLITE_CORRUPT) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is not a ringmaster job database (", code == SQLITE_NOTADB ? "not SQLite" :
        "SQLite reports it corrupt", "); restore it from a backup, or start a new cluster on "
        "another --db path"));
  }
  return s;
}

// What is at `path` before SQLite touches it (SQLite deletes the WAL of an empty database
// file, so this must come first).
struct Found {
  bool existed = false;  // the database file, or its WAL
  std::string damage;    // empty, or what is wrong: an empty file, a WAL alone
};

Found Inspect(const std::string& path) {
  struct stat db, wal;
  const bool have_db = stat(path.c_str(), &db) == 0;
  const bool have_wal = stat((path + "-wal").c_str(), &wal) == 0 && wal.st_size > 0;
  Found found;
  found.existed = have_db || have_wal;
  if (have_db && db.st_size == 0) {
    found.damage = absl::StrCat("is empty (0 bytes", have_wal ? ", with a WAL beside it" : "",
                                "): truncated, or created by something else");
  } else if (!have_db && have_wal) {
    found.damage = absl::StrCat("is missing while its WAL ", path,
                                "-wal is there: the database was removed");
  }
  return found;
}

absl::Status RefuseDamaged(const std::string& path, absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(
      "the job database ", path, " ", what,
      ". Starting on it would forget every job and the membership secret (agents and "
      "running trainers would be locked out). Restore it from a backup, or pass --fresh_db "
      "to start a new cluster with no jobs on purpose"));
}

// Prepared statement, finalized on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Statement() { sqlite3_finalize(stmt_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path,
                                                         const JobStoreOptions& options) {
  if (path.empty()) return absl::InvalidArgumentError("the job database path is empty");
  const Found inspected = Inspect(path);
  if (!inspected.damage.empty()) {
    if (!options.start_fresh) return RefuseDamaged(path, inspected.damage);
    LOG(WARNING) << "the job database " << path << " " << inspected.damage
                 << "; starting a fresh cluster on it as --fresh_db asks";
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create the directory of the job database ", path, ": ",
                       ec.message()));
    }
  }
  // The database holds the membership secret: it is the coordinator's alone. Created 0600
  // before SQLite opens it (SQLite gives its WAL and shared-memory files the database's
  // mode), and an existing one made readable by an older version is closed up.
  for (const std::string& file : {path, path + "-wal", path + "-shm"}) {
    const int fd = open(file.c_str(), (file == path ? O_CREAT : 0) | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (file != path && errno == ENOENT) continue;
      return absl::FailedPreconditionError(absl::StrCat("cannot open the job database ", file,
                                                        ": ", strerror(errno)));
    }
    struct stat st;
    const bool ok = fstat(fd, &st) == 0 && ((st.st_mode & 0077) == 0 || fchmod(fd, 0600) == 0);
    const int err = errno;
    close(fd);
    if (!ok) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the job database ", file, " is readable by other users and cannot be made 0600: ",
          strerror(err)));
    }
  }
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    absl::Status s = SqliteError(db, "cannot open the job database", path);
    sqlite3_close(db);
    return s;
  }
  std::unique_ptr<JobStore> store(new JobStore(db, path));
  absl::MutexLock lock(&store->mu_);
  sqlite3_busy_timeout(db, 0);
  // Exclusive locking takes effect at the first write; the schema transaction below is one.
  // An existing file's tables are checked before anything is written to it (the WAL pragma
  // writes the header).
  if (absl::Status s = store->Exec("PRAGMA locking_mode=EXCLUSIVE"); !s.ok()) {
    return ExplainOpenError(db, s, path);
  }
  if (inspected.existed && inspected.damage.empty()) {
    RM_RETURN_IF_ERROR(store->CheckTables(options));
  }
  for (const char* pragma : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL"}) {
    absl::Status s = store->Exec(pragma);
    if (!s.ok()) {
      return ExplainOpenError(db, s, path);
    }
  }
  absl::Status s = store->Exec(
      "BEGIN IMMEDIATE;"
      "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);"
      "CREATE TABLE IF NOT EXISTS jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
      "  id TEXT UNIQUE NOT NULL, job BLOB NOT NULL);"
      "CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
      "INSERT OR IGNORE INTO meta VALUES ('schema_version', 1);"
      "COMMIT;");
  if (!s.ok()) {
    return ExplainOpenError(db, s, path);
  }
  Statement version(db, "SELECT value FROM meta WHERE key = 'schema_version'");
  if (!version.ok() || sqlite3_step(version.get()) != SQLITE_ROW) {
    return SqliteError(db, "cannot read the schema version", path);
  }
  const int found = sqlite3_column_int(version.get(), 0);
  if (found != kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job database ", path, " has schema version ", found, "; this ringmaster reads ",
        kSchemaVersion));
  }
  return store;
}

absl::Status JobStore::CheckTables(const JobStoreOptions& options) {
  Statement tables(db_,
                   "SELECT count(*) FROM sqlite_master "
                   "WHERE type = 'table' AND name IN ('meta', 'jobs', 'settings')");
  if (!tables.ok() || sqlite3_step(tables.get()) != SQLITE_ROW) {
    return ExplainOpenError(db_, SqliteError(db_, "cannot read the tables", path_), path_);
  }
  const int found = sqlite3_column_int(tables.get(), 0);
  if (found == 3) return absl::OkStatus();
  const std::string what =
      absl::StrCat("lacks ringmaster's tables (has ", found, " of meta, jobs, settings)");
  if (!options.start_fresh) return RefuseDamaged(path_, what);
  LOG(WARNING) << "the job database " << path_ << " " << what
               << "; starting a fresh cluster on it as --fresh_db asks";
  return absl::OkStatus();
}

JobStore::~JobStore() {
  absl::MutexLock lock(&mu_);
  sqlite3_close(db_);
}

absl::Status JobStore::Exec(const char* sql) {
  char* message = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    absl::Status s = absl::InternalError(
        absl::StrCat("job database ", path_, ": ", message != nullptr ? message : "error"));
    sqlite3_free(message);
    return s;
  }
  return absl::OkStatus();
}

absl::Status JobStore::Put(const Job& job) {
  if (job.id().empty()) return absl::InvalidArgumentError("Job.id is empty");
  std::string blob;
  if (!job.SerializeToString(&blob)) {
    return absl::InternalError(absl::StrCat("cannot serialise job ", job.id()));
  }
  absl::MutexLock lock(&mu_);
  Statement put(db_,
                "INSERT INTO jobs (id, job) VALUES (?1, ?2) "
                "ON CONFLICT(id) DO UPDATE SET job = excluded.job");
  if (!put.ok()) return SqliteError(db_, "cannot prepare the job write", path_);
  sqlite3_bind_text(put.get(), 1, job.id().data(), static_cast<int>(job.id().size()),
                    SQLITE_TRANSIENT);
  sqlite3_bind_blob(put.get(), 2, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(put.get()) != SQLITE_DONE) {
    return SqliteError(db_, absl::StrCat("cannot write job ", job.id()), path_);
  }
  return absl::OkStatus();
}

absl::Status JobStore::Delete(const std::string& id) {
  absl::MutexLock lock(&mu_);
  Statement del(db_, "DELETE FROM jobs WHERE id = ?1");
  if (!del.ok()) return SqliteError(db_, "cannot prepare the job removal", path_);
  sqlite3_bind_text(del.get(), 1, id.data(), static_cast<int>(id.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(del.get()) != SQLITE_DONE) {
    return SqliteError(db_, absl::StrCat("cannot remove job ", id), path_);
  }
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no job \"", id, "\""));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Job>> JobStore::LoadAll() {
  absl::MutexLock lock(&mu_);
  Statement all(db_, "SELECT id, job FROM jobs ORDER BY seq");
  if (!all.ok()) return SqliteError(db_, "cannot prepare the job read", path_);
  std::vector<Job> jobs;
  int rc;
  while ((rc = sqlite3_step(all.get())) == SQLITE_ROW) {
    const char* id = reinterpret_cast<const char*>(sqlite3_column_text(all.get(), 0));
    Job job;
    if (!job.ParseFromArray(sqlite3_column_blob(all.get(), 1),
                            sqlite3_column_bytes(all.get(), 1))) {
      return absl::DataLossError(
          absl::StrCat("job ", id != nullptr ? id : "?", " in ", path_, " does not parse"));
    }
    jobs.push_back(std::move(job));
  }
  if (rc != SQLITE_DONE) return SqliteError(db_, "cannot read the jobs", path_);
  return jobs;
}

absl::StatusOr<Job> JobStore::Get(const std::string& id) {
  absl::MutexLock lock(&mu_);
  Statement get(db_, "SELECT job FROM jobs WHERE id = ?1");
  if (!get.ok()) return SqliteError(db_, "cannot prepare the job read", path_);
  sqlite3_bind_text(get.get(), 1, id.data(), static_cast<int>(id.size()), SQLITE_TRANSIENT);
  const int rc = sqlite3_step(get.get());
  if (rc == SQLITE_DONE) return absl::NotFoundError(absl::StrCat("no job \"", id, "\""));
  if (rc != SQLITE_ROW) return SqliteError(db_, absl::StrCat("cannot read job ", id), path_);
  Job job;
  if (!job.ParseFromArray(sqlite3_column_blob(get.get(), 0), sqlite3_column_bytes(get.get(), 0))) {
    return absl::DataLossError(absl::StrCat("job ", id, " in ", path_, " does not parse"));
  }
  return job;
}

absl::StatusOr<std::string> JobStore::GetOrCreateSetting(const std::string& key,
                                                         const std::string& initial) {
  absl::MutexLock lock(&mu_);
  Statement insert(db_, "INSERT OR IGNORE INTO settings (key, value) VALUES (?1, ?2)");
  if (!insert.ok()) return SqliteError(db_, "cannot prepare the settings write", path_);
  sqlite3_bind_text(insert.get(), 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
  sqlite3_bind_text(insert.get(), 2, initial.data(), static_cast<int>(initial.size()),
                    SQLITE_TRANSIENT);
  if (sqlite3_step(insert.get()) != SQLITE_DONE) {
    return SqliteError(db_, absl::StrCat("cannot write setting ", key), path_);
  }
  Statement get(db_, "SELECT value FROM settings WHERE key = ?1");
  if (!get.ok()) return SqliteError(db_, "cannot prepare the settings read", path_);
  sqlite3_bind_text(get.get(), 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(get.get()) != SQLITE_ROW) {
    return SqliteError(db_, absl::StrCat("cannot read setting ", key), path_);
  }
  return std::string(reinterpret_cast<const char*>(sqlite3_column_text(get.get(), 0)),
                     sqlite3_column_bytes(get.get(), 0));
}

}  // namespace ringmaster::coordinator
