#include "bench/comm_bench.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace ringmaster::bench {
namespace {

comm::OpKind KindOf(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return comm::OpKind::kAllReduce;
    case CollectiveOp::kAllGather:
      return comm::OpKind::kAllGather;
    case CollectiveOp::kReduceScatter:
      return comm::OpKind::kReduceScatter;
    case CollectiveOp::kBroadcast:
      return comm::OpKind::kBroadcast;
  }
  return comm::OpKind::kAllReduce;
}

}  // namespace

absl::StatusOr<std::vector<Row>> RunSweep(comm::TcpCommunicator& comm,
                                          const SweepOptions& options) {
  const int n = comm.size(), r = comm.rank();
  std::vector<Row> rows;
  std::vector<float> send(256, 1.0f), recv(256);
  // Fresh ranks are slow for their first few hundred small messages (measured: 130 us
  // instead of 8 us per 1 KiB all-gather; with 4 ranks on 2 cores, 170 us instead of 25 us
  // per 1 KiB all-reduce for a fraction of a second), so exchange small messages for
  // options.settle first, as rank 0's clock decides (the peers' harnesses do the same,
  // peers::Settle).
  const absl::Time settle_until = absl::Now() + options.settle;
  for (int i = 0;; ++i) {
    send[0] = r == 0 && (i < 300 || absl::Now() < settle_until) ? 1.0f : 0.0f;
    RM_RETURN_IF_ERROR(comm.AllReduce(send.data(), recv.data(), send.size(), DataType::kFloat32,
                                      comm::ReduceOp::kMax, absl::Now() + options.op_timeout));
    if (recv[0] == 0) break;
  }
  send.assign(send.size(), 1.0f);
  for (CollectiveOp op : options.ops) {
    for (uint64_t size : options.sizes) {
      // Elements per rank-side buffer, following nccl-tests' size convention.
      size_t total = std::max<size_t>(size / sizeof(float), 1);
      size_t count = total;  // all-reduce, broadcast: per rank
      if (op == CollectiveOp::kAllGather || op == CollectiveOp::kReduceScatter) {
        count = std::max<size_t>(total / n, 1);  // per-rank chunk
        total = count * n;
      }
      size_t send_count = op == CollectiveOp::kReduceScatter ? total : count;
      size_t recv_count = op == CollectiveOp::kAllGather ? total : count;
      // Touch the buffers once so page faults stay out of the timing.
      send.assign(send_count, static_cast<float>(r + 1));
      recv.assign(recv_count, 0.0f);
      const uint64_t bytes = (op == CollectiveOp::kAllGather || op == CollectiveOp::kReduceScatter)
                                 ? total * sizeof(float)
                                 : count * sizeof(float);
      auto run_once = [&]() -> absl::Status {
        absl::Time deadline = absl::Now() + options.op_timeout;
        switch (op) {
          case CollectiveOp::kAllReduce:
            return comm.AllReduceWith(options.algorithm, send.data(), recv.data(), count,
                                      DataType::kFloat32, comm::ReduceOp::kSum, deadline);
          case CollectiveOp::kAllGather:
            return comm.AllGather(send.data(), recv.data(), count, DataType::kFloat32, deadline);
          case CollectiveOp::kReduceScatter:
            return comm.ReduceScatter(send.data(), recv.data(), count, DataType::kFloat32,
                                      comm::ReduceOp::kSum, deadline);
          case CollectiveOp::kBroadcast:
            return comm.Broadcast(send.data(), recv.data(), count, DataType::kFloat32, 0, deadline);
        }
        return absl::OkStatus();
      };
      // Check the result once.
      RM_RETURN_IF_ERROR(run_once());
      const float want_sum = n * (n + 1) / 2.0f;
      for (size_t i = 0; i < recv_count; i += std::max<size_t>(1, recv_count / 1024)) {
        float want = 0;
        switch (op) {
          case CollectiveOp::kAllReduce:
          case CollectiveOp::kReduceScatter:
            want = want_sum;
            break;
          case CollectiveOp::kAllGather:
            want = static_cast<float>(i / count + 1);
            break;
          case CollectiveOp::kBroadcast:
            want = 1.0f;
            break;
        }
        if (recv[i] != want) {
          return absl::InternalError(absl::StrCat(CollectiveName(op), " of ", bytes,
                                                  " bytes: element ", i, " is ", recv[i],
                                                  ", expected ", want, " (rank ", r, ")"));
        }
      }
      const int iters =
          static_cast<int>(std::clamp<uint64_t>(options.bytes_budget / std::max<uint64_t>(bytes, 1),
                                                options.min_iters, options.max_iters));
      const int warmup = std::max(options.warmup, iters / 2);
      for (int i = 0; i < warmup; ++i) RM_RETURN_IF_ERROR(run_once());
      std::vector<double> times(iters);
      const comm::OpCounters before = comm.counters().of(KindOf(op));
      for (int i = 0; i < iters; ++i) {
        RM_RETURN_IF_ERROR(comm.Barrier(absl::Now() + options.op_timeout));
        absl::Time t0 = absl::Now();
        RM_RETURN_IF_ERROR(run_once());
        times[i] = absl::ToDoubleMicroseconds(absl::Now() - t0);
      }
      const comm::OpCounters after = comm.counters().of(KindOf(op));
      double sent[2] = {
          static_cast<double>(after.bytes_sent - before.bytes_sent) / iters / n,
          static_cast<double>(after.formula_bytes_sent - before.formula_bytes_sent) / iters / n};
      RM_RETURN_IF_ERROR(comm.AllReduce(sent, sent, 2, DataType::kFloat64, comm::ReduceOp::kSum,
                                        absl::Now() + options.op_timeout));
      // An iteration lasts as long as its slowest rank.
      RM_RETURN_IF_ERROR(comm.AllReduce(times.data(), times.data(), times.size(),
                                        DataType::kFloat64, comm::ReduceOp::kMax,
                                        absl::Now() + options.op_timeout));
      std::sort(times.begin(), times.end());
      Row row;
      row.op = op;
      row.ranks = n;
      row.bytes = bytes;
      row.time_us = times[times.size() / 2];
      row.p90_us = times[std::min(times.size() - 1, times.size() * 9 / 10)];
      row.max_us = times.back();
      row.algbw_gbps = bytes / (row.time_us * 1e-6) / 1e9;
      row.busbw_gbps = row.algbw_gbps * BusFactor(op, n);
      row.sent_bytes = sent[0];
      row.formula_bytes = sent[1];
      rows.push_back(row);
    }
  }
  return rows;
}

std::string ToCsv(const std::vector<Row>& rows) {
  std::string out = "op,ranks,bytes,time_us,algbw_gbps,busbw_gbps,sent_bytes,formula_bytes\n";
  for (const Row& r : rows) {
    absl::StrAppend(&out, CollectiveName(r.op), ",", r.ranks, ",", r.bytes, ",",
                    absl::StrFormat("%.2f,%.4f,%.4f,%.1f,%.1f", r.time_us, r.algbw_gbps,
                                    r.busbw_gbps, r.sent_bytes, r.formula_bytes),
                    "\n");
  }
  return out;
}

std::string TransportName(const comm::TcpCommunicator& comm) {
  const int shm = comm.shared_memory_peers();
  if (shm == 0) return "TCP";
  return shm == comm.size() - 1 ? "shared memory" : "shared memory and TCP";
}

double MeasureCopyGbps(size_t bytes, int reps) {
  if (bytes == 0) return 0;
  std::vector<char> from(bytes, 1), to(bytes, 0);
  double best = 0;
  volatile char seen = 0;  // reads each copy, so that none is optimized away
  for (int i = 0; i < reps; ++i) {
    const absl::Time t0 = absl::Now();
    std::memcpy(to.data(), from.data(), bytes);
    const double s = absl::ToDoubleSeconds(absl::Now() - t0);
    seen = to[bytes / 2];
    if (s > 0) best = std::max(best, bytes / s / 1e9);
  }
  (void)seen;
  return best;
}

}  // namespace ringmaster::bench
