#include "train/pipeline/schedule.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace ringmaster::train::pipeline {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

struct Compute {
  ActionKind kind;
  int stage;
  int micro;
};
using Orders = std::vector<std::vector<Compute>>;  // per rank

absl::Status Invalid(absl::string_view field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// gpipe: every forward, then every backward, in micro-batch order.
Orders GPipe(int p, int m) {
  Orders orders(p);
  for (int r = 0; r < p; ++r) {
    for (int i = 0; i < m; ++i) orders[r].push_back({ActionKind::kForward, r, i});
    for (int i = 0; i < m; ++i) orders[r].push_back({ActionKind::kBackward, r, i});
  }
  return orders;
}

// 1f1b: warm-up forwards, then a forward and a backward alternately, then the backwards left.
Orders OneFOneB(int p, int m) {
  Orders orders(p);
  for (int r = 0; r < p; ++r) {
    const int warm = std::min(p - r - 1, m);
    for (int i = 0; i < warm; ++i) orders[r].push_back({ActionKind::kForward, r, i});
    for (int i = 0; i < m - warm; ++i) {
      orders[r].push_back({ActionKind::kForward, r, warm + i});
      orders[r].push_back({ActionKind::kBackward, r, i});
    }
    for (int i = m - warm; i < m; ++i) orders[r].push_back({ActionKind::kBackward, r, i});
  }
  return orders;
}

// Megatron's interleaved 1F1B over v chunks per rank (m a multiple of p): the k-th
// chunk-forward of a rank is micro-batch (k / (p·v))·p + k mod p on chunk (k / p) mod v; the
// k-th chunk-backward the same micro-batch on chunk v − 1 − (k / p) mod v. Its messages are
// placed as Megatron's forward_backward_pipelining_with_interleaving places them: each step's
// sends in one batch with the receives of the next step (a steady step is a forward and a
// backward with no message between them), so that every rank's batches meet their peers'
// even when no message is buffered.
Schedule Interleaved(const ScheduleOptions& o) {
  const int p = o.ranks, m = o.micro_batches, v = o.virtual_stages;
  Schedule schedule;
  schedule.options = o;
  schedule.ranks.resize(p);
  const int total = m * v, last = schedule.stages() - 1;
  auto micro = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto forward_stage = [&](int k, int r) { return ((k / p) % v) * p + r; };
  auto backward_stage = [&](int k, int r) { return (v - 1 - (k / p) % v) * p + r; };
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& list = schedule.ranks[r];
    auto message = [&](ActionKind kind, Payload payload, int stage, int mb, int peer_stage) {
      const int peer = schedule.RankOfStage(peer_stage);
      if (peer != r) list.push_back({kind, stage, mb, payload, peer});
    };
    // The messages around chunk-forward k and chunk-backward k.
    auto send_forward = [&](int k) {
      const int st = forward_stage(k, r);
      if (st < last) message(ActionKind::kSend, Payload::kActivation, st, micro(k), st + 1);
    };
    auto recv_forward = [&](int k) {
      const int st = forward_stage(k, r);
      if (st > 0) message(ActionKind::kReceive, Payload::kActivation, st - 1, micro(k), st - 1);
    };
    auto send_backward = [&](int k) {
      const int st = backward_stage(k, r);
      if (st > 0) message(ActionKind::kSend, Payload::kGradient, st, micro(k), st - 1);
    };
    auto recv_backward = [&](int k) {
      const int st = backward_stage(k, r);
      if (st < last) message(ActionKind::kReceive, Payload::kGradient, st + 1, micro(k), st + 1);
    };
    auto forward = [&](int k) {
      list.push_back({ActionKind::kForward, forward_stage(k, r), micro(k)});
    };
    auto backward = [&](int k) {
      list.push_back({ActionKind::kBackward, backward_stage(k, r), micro(k)});
    };
    const int warm = std::min((p - r - 1) * 2 + (v - 1) * p, total);
    const int steady = total - warm;
    recv_forward(0);
    for (int k = 0; k < warm; ++k) {
      forward(k);
      send_forward(k);
      if (k + 1 < total) recv_forward(k + 1);
      if (k == warm - 1 && steady > 0) recv_backward(0);
    }
    for (int i = 0; i < steady; ++i) {
      forward(warm + i);
      backward(i);
      send_forward(warm + i);
      send_backward(i);
      if (warm + i + 1 < total) recv_forward(warm + i + 1);
      recv_backward(i + 1);
    }
    if (steady == 0) recv_backward(0);
    for (int k = steady; k < total; ++k) {
      backward(k);
      send_backward(k);
      if (k + 1 < total) recv_backward(k + 1);
    }
  }
  return schedule;
}

// ZB-H1 by list scheduling with unit costs (F = B = W = 1): each rank keeps 1F1B's order of
// forwards and input-gradient parts; at each time step an idle rank runs the next of them if
// it is ready (a forward also only while the rank keeps fewer than p micro-batches of
// activations: forwards without their W, the first rank's 1F1B peak), else its oldest
// pending W, else waits.
Orders ZeroBubble(int p, int m) {
  const Orders one_f_one_b = OneFOneB(p, m);
  Orders orders(p);
  // When each stage's F and B of each micro-batch finished (kNever: not yet).
  std::vector<std::vector<double>> f_done(p, std::vector<double>(m, kNever));
  std::vector<std::vector<double>> b_done(p, std::vector<double>(m, kNever));
  std::vector<size_t> next(p, 0);
  std::vector<int> kept(p, 0);
  std::vector<std::deque<int>> pending_w(p);
  std::vector<double> free_at(p, 0);
  int left = 3 * p * m;
  for (double t = 0; left > 0; t += 1) {
    for (int r = 0; r < p; ++r) {
      if (free_at[r] > t) continue;
      bool ready = false;
      Compute c{};
      if (next[r] < one_f_one_b[r].size()) {
        c = one_f_one_b[r][next[r]];
        const int i = c.micro;
        ready = c.kind == ActionKind::kForward
                    ? (r == 0 || f_done[r - 1][i] <= t) && kept[r] < p
                    : f_done[r][i] <= t && (r == p - 1 || b_done[r + 1][i] <= t);
      }
      if (ready && c.kind == ActionKind::kForward) {
        orders[r].push_back(c);
        f_done[r][c.micro] = t + 1;
        ++kept[r];
        ++next[r];
      } else if (ready) {
        orders[r].push_back({ActionKind::kBackwardInput, r, c.micro});
        b_done[r][c.micro] = t + 1;
        pending_w[r].push_back(c.micro);
        ++next[r];
      } else if (!pending_w[r].empty()) {
        orders[r].push_back({ActionKind::kBackwardWeight, r, pending_w[r].front()});
        pending_w[r].pop_front();
        --kept[r];
      } else {
        continue;
      }
      free_at[r] = t + 1;
      --left;
    }
  }
  return orders;
}

// The lists: each compute with the receive of what it needs before it and the send of what it
// makes after it, when the other stage is on another rank.
Schedule WithMessages(const ScheduleOptions& options, const Orders& orders) {
  Schedule schedule;
  schedule.options = options;
  schedule.ranks.resize(options.ranks);
  const int last = schedule.stages() - 1;
  for (int r = 0; r < options.ranks; ++r) {
    std::vector<Action>& list = schedule.ranks[r];
    for (const Compute& c : orders[r]) {
      auto message = [&](ActionKind kind, Payload payload, int stage, int peer_stage) {
        const int peer = schedule.RankOfStage(peer_stage);
        if (peer == r) return;
        list.push_back({kind, stage, c.micro, payload, peer});
      };
      const bool backward = c.kind == ActionKind::kBackward || c.kind == ActionKind::kBackwardInput;
      if (c.kind == ActionKind::kForward && c.stage > 0) {
        message(ActionKind::kReceive, Payload::kActivation, c.stage - 1, c.stage - 1);
      }
      if (backward && c.stage < last) {
        message(ActionKind::kReceive, Payload::kGradient, c.stage + 1, c.stage + 1);
      }
      list.push_back({c.kind, c.stage, c.micro});
      if (c.kind == ActionKind::kForward && c.stage < last) {
        message(ActionKind::kSend, Payload::kActivation, c.stage, c.stage + 1);
      }
      if (backward && c.stage > 0) {
        message(ActionKind::kSend, Payload::kGradient, c.stage, c.stage - 1);
      }
    }
  }
  return schedule;
}

using MessageKey = std::tuple<Payload, int, int>;  // payload, stage, micro-batch
MessageKey KeyOf(const Action& a) { return {a.payload, a.stage, a.micro_batch}; }

absl::Status Broken(int rank, size_t index, const Action& a, const std::string& why) {
  return absl::InternalError(
      absl::StrCat("rank ", rank, " action ", index, " (", a.DebugString(), "): ", why));
}

// What CheckRankList counts over all ranks' lists.
struct ListCounts {
  std::map<std::tuple<ActionKind, int, int>, int> computed;  // (kind, stage, micro) → times
  std::map<MessageKey, int> sent_by, received_by;            // message → the rank
};

// Rank r's list on its own: each action in range and on the right rank, each compute after
// what it needs, each message sent after it is computed and received by the rank that uses it.
absl::Status CheckRankList(const Schedule& s, int r, ListCounts& counts) {
  const int stages = s.stages(), m = s.options.micro_batches;
  // What this rank has done or received so far in its list.
  std::map<std::tuple<ActionKind, int, int>, bool> done;
  std::map<MessageKey, bool> have;
  auto did = [&](ActionKind k, int stage, int micro) { return done.count({k, stage, micro}) > 0; };
  auto backward_done = [&](int stage, int micro) {
    return did(ActionKind::kBackward, stage, micro) ||
           did(ActionKind::kBackwardInput, stage, micro);
  };
  for (size_t i = 0; i < s.ranks[r].size(); ++i) {
    const Action& a = s.ranks[r][i];
    if (a.stage < 0 || a.stage >= stages || a.micro_batch < 0 || a.micro_batch >= m) {
      return Broken(r, i, a, "stage or micro-batch out of range");
    }
    const int st = a.stage, mb = a.micro_batch;
    if (a.is_compute()) {
      if (s.RankOfStage(st) != r) {
        return Broken(r, i, a, absl::StrCat("stage ", st, " is rank ", s.RankOfStage(st), "'s"));
      }
      if (++counts.computed[{a.kind, st, mb}] > 1) return Broken(r, i, a, "computed twice");
      if (a.kind == ActionKind::kForward && st > 0 && !did(ActionKind::kForward, st - 1, mb) &&
          !have.count({Payload::kActivation, st - 1, mb})) {
        return Broken(r, i, a, "its input is neither computed here nor received before");
      }
      const bool backward = a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput;
      if (backward && !did(ActionKind::kForward, st, mb)) {
        return Broken(r, i, a, "before its forward");
      }
      if (backward && st < stages - 1 && !backward_done(st + 1, mb) &&
          !have.count({Payload::kGradient, st + 1, mb})) {
        return Broken(r, i, a,
                      "its output's gradient is neither computed here nor received before");
      }
      if (a.kind == ActionKind::kBackwardWeight && !did(ActionKind::kBackwardInput, st, mb)) {
        return Broken(r, i, a, "before its input-gradient part");
      }
      done[{a.kind, st, mb}] = true;
      continue;
    }
    const bool activation = a.payload == Payload::kActivation;
    const int needs = activation ? st + 1 : st - 1;  // the stage that uses it
    if (needs < 0 || needs >= stages) return Broken(r, i, a, "no stage uses it");
    if (a.kind == ActionKind::kSend) {
      if (s.RankOfStage(st) != r) return Broken(r, i, a, "sent by a rank that does not compute it");
      if (a.peer != s.RankOfStage(needs) || a.peer == r) {
        return Broken(r, i, a,
                      absl::StrCat("sent to rank ", a.peer, ", but stage ", needs, " is on rank ",
                                   s.RankOfStage(needs)));
      }
      if (activation ? !did(ActionKind::kForward, st, mb) : !backward_done(st, mb)) {
        return Broken(r, i, a, "sent before it is computed");
      }
      if (!counts.sent_by.emplace(KeyOf(a), r).second) return Broken(r, i, a, "sent twice");
    } else {
      if (s.RankOfStage(needs) != r) {
        return Broken(r, i, a, "received by a rank that does not use it");
      }
      if (a.peer != s.RankOfStage(st)) {
        return Broken(r, i, a,
                      absl::StrCat("received from rank ", a.peer, ", but stage ", st,
                                   " is on rank ", s.RankOfStage(st)));
      }
      if (!counts.received_by.emplace(KeyOf(a), r).second) {
        return Broken(r, i, a, "received twice");
      }
      have[KeyOf(a)] = true;
    }
  }
  return absl::OkStatus();
}

// Every stage's work of every micro-batch ran once, in the schedule's backward form.
absl::Status CheckEveryComputeOnce(const Schedule& s, const ListCounts& counts) {
  std::vector<ActionKind> kinds = {ActionKind::kForward};
  if (s.options.kind == ScheduleKind::kZeroBubble) {
    kinds.insert(kinds.end(), {ActionKind::kBackwardInput, ActionKind::kBackwardWeight});
  } else {
    kinds.push_back(ActionKind::kBackward);
  }
  for (int st = 0; st < s.stages(); ++st) {
    for (int mb = 0; mb < s.options.micro_batches; ++mb) {
      for (ActionKind k : kinds) {
        auto it = counts.computed.find({k, st, mb});
        if (it == counts.computed.end() || it->second != 1) {
          const Action a{k, st, mb};
          return absl::InternalError(
              absl::StrCat("rank ", s.RankOfStage(st), " never runs ", a.DebugString()));
        }
      }
    }
  }
  return absl::OkStatus();
}

// Every message sent is received, and every one received is sent.
absl::Status CheckMessagesPaired(const ListCounts& counts) {
  for (const auto& [key, rank] : counts.sent_by) {
    if (!counts.received_by.count(key)) {
      const auto& [payload, st, mb] = key;
      return absl::InternalError(absl::StrCat("rank ", rank, " sends ", PayloadName(payload),
                                              " of stage ", st, " micro-batch ", mb,
                                              " that no rank receives"));
    }
  }
  for (const auto& [key, rank] : counts.received_by) {
    if (!counts.sent_by.count(key)) {
      const auto& [payload, st, mb] = key;
      return absl::InternalError(absl::StrCat("rank ", rank, " waits for the ",
                                              PayloadName(payload), " of stage ", st,
                                              " micro-batch ", mb, " that no rank sends"));
    }
  }
  return absl::OkStatus();
}

// A transport delivers one sender's messages to one receiver in the order sent: the
// receiver must take them in that order.
absl::Status CheckPairOrder(const Schedule& s) {
  std::map<std::pair<int, int>, std::vector<MessageKey>> sent, received;  // (from, to)
  for (int r = 0; r < s.options.ranks; ++r) {
    for (const Action& a : s.ranks[r]) {
      if (a.kind == ActionKind::kSend) sent[{r, a.peer}].push_back(KeyOf(a));
      if (a.kind == ActionKind::kReceive) received[{a.peer, r}].push_back(KeyOf(a));
    }
  }
  for (const auto& [pair, keys] : sent) {
    const std::vector<MessageKey>& taken = received[pair];
    for (size_t i = 0; i < keys.size() && i < taken.size(); ++i) {
      if (keys[i] != taken[i]) {
        const Action a{ActionKind::kReceive, std::get<1>(taken[i]), std::get<2>(taken[i]),
                       std::get<0>(taken[i]), pair.first};
        return absl::InternalError(absl::StrCat("rank ", pair.second, " receives from rank ",
                                                pair.first, " out of order: its ", i + 1,
                                                "th receive from it is ", a.DebugString(),
                                                ", but message ", i + 1, " sent is another"));
      }
    }
  }
  return absl::OkStatus();
}

// The static rules of CheckSchedule (all but deadlock).
absl::Status CheckLists(const Schedule& s) {
  if (static_cast<int>(s.ranks.size()) != s.options.ranks) {
    return absl::InternalError(
        absl::StrCat(s.ranks.size(), " lists for ", s.options.ranks, " ranks"));
  }
  ListCounts counts;
  for (int r = 0; r < s.options.ranks; ++r) RM_RETURN_IF_ERROR(CheckRankList(s, r, counts));
  RM_RETURN_IF_ERROR(CheckEveryComputeOnce(s, counts));
  RM_RETURN_IF_ERROR(CheckMessagesPaired(counts));
  return CheckPairOrder(s);
}

// "rank r at action i (...)" for each rank whose list did not end at next[r].
std::vector<std::string> Stuck(const Schedule& s, const std::vector<size_t>& next) {
  std::vector<std::string> stuck;
  for (int r = 0; r < s.options.ranks; ++r) {
    if (next[r] < s.ranks[r].size()) {
      stuck.push_back(absl::StrCat("rank ", r, " at action ", next[r], " (",
                                   s.ranks[r][next[r]].DebugString(), ")"));
    }
  }
  return stuck;
}

// Runs the lists with every maximal run of sends and receives as one batch that progresses
// together (Communicator::SendRecv) and a message moving only while both its send and its
// receive are posted (rendezvous: a transport need not buffer anything). INTERNAL naming the
// stuck ranks when no batch can complete.
absl::Status CheckRendezvous(const Schedule& s) {
  const int p = s.options.ranks;
  std::vector<size_t> next(p, 0), batch_end(p, 0);
  std::vector<bool> posted(p, false);
  // Per rank, the posted batch's operations not yet done (by message).
  std::vector<std::map<std::pair<ActionKind, MessageKey>, bool>> pending(p);
  bool moved = true;
  while (moved) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      if (posted[r]) continue;
      while (next[r] < s.ranks[r].size() && s.ranks[r][next[r]].is_compute()) {
        ++next[r];
        moved = true;
      }
      if (next[r] == s.ranks[r].size()) continue;
      size_t end = next[r];
      while (end < s.ranks[r].size() && !s.ranks[r][end].is_compute()) {
        pending[r][{s.ranks[r][end].kind, KeyOf(s.ranks[r][end])}] = true;
        ++end;
      }
      batch_end[r] = end;
      posted[r] = true;
      moved = true;
    }
    for (int r = 0; r < p; ++r) {
      if (!posted[r]) continue;
      for (auto it = pending[r].begin(); it != pending[r].end();) {
        const auto& [kind, key] = it->first;
        if (kind != ActionKind::kSend) {
          ++it;
          continue;
        }
        // The receiver: the rank of the stage that uses the message.
        const int to = s.RankOfStage(
            std::get<0>(key) == Payload::kActivation ? std::get<1>(key) + 1 : std::get<1>(key) - 1);
        auto match = pending[to].find({ActionKind::kReceive, key});
        if (!posted[to] || match == pending[to].end()) {
          ++it;
          continue;
        }
        pending[to].erase(match);
        it = pending[r].erase(it);
        moved = true;
      }
    }
    for (int r = 0; r < p; ++r) {
      if (posted[r] && pending[r].empty()) {
        next[r] = batch_end[r];
        posted[r] = false;
        moved = true;
      }
    }
  }
  const std::vector<std::string> stuck = Stuck(s, next);
  if (stuck.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      "the schedule deadlocks when a message moves only while its send and receive are both "
      "posted: ",
      absl::StrJoin(stuck, "; ")));
}

double Duration(const Action& a, const Costs& c, int v) {
  switch (a.kind) {
    case ActionKind::kForward:
      return c.forward / v;
    case ActionKind::kBackward:
      return (c.backward_input + c.backward_weight) / v;
    case ActionKind::kBackwardInput:
      return c.backward_input / v;
    case ActionKind::kBackwardWeight:
      return c.backward_weight / v;
    default:
      return 0;
  }
}

// Runs the lists (the executor's contract, schedule.h); INTERNAL for a deadlock.
absl::StatusOr<Timeline> Run(const Schedule& s, const Costs& costs) {
  const int p = s.options.ranks, v = s.options.virtual_stages;
  const bool split = s.options.kind == ScheduleKind::kZeroBubble;
  Timeline t;
  t.busy.assign(p, 0);
  t.peak_activations.assign(p, 0);
  std::vector<size_t> next(p, 0);
  std::vector<double> now(p, 0);
  std::vector<int> kept(p, 0);  // chunk-micro-batches with activations kept
  std::map<MessageKey, double> arrival;
  std::vector<std::vector<Timeline::Slot>> slots(p);
  bool moved = true;
  while (moved) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      while (next[r] < s.ranks[r].size()) {
        const Action& a = s.ranks[r][next[r]];
        if (a.kind == ActionKind::kSend) {
          arrival[KeyOf(a)] = now[r] + costs.message;
        } else if (a.kind == ActionKind::kReceive) {
          auto it = arrival.find(KeyOf(a));
          if (it == arrival.end()) break;
          now[r] = std::max(now[r], it->second);
        } else {
          const double d = Duration(a, costs, v);
          slots[r].push_back({r, now[r], now[r] + d, a});
          now[r] += d;
          t.busy[r] += d;
          if (a.kind == ActionKind::kForward) {
            ++kept[r];
            t.peak_activations[r] =
                std::max(t.peak_activations[r], static_cast<double>(kept[r]) / v);
          }
          if (a.kind == (split ? ActionKind::kBackwardWeight : ActionKind::kBackward)) --kept[r];
        }
        ++next[r];
        moved = true;
      }
    }
  }
  const std::vector<std::string> stuck = Stuck(s, next);
  if (!stuck.empty()) {
    return absl::InternalError(absl::StrCat("the schedule deadlocks: ", absl::StrJoin(stuck, "; "),
                                            " wait(s) for a message never sent"));
  }
  for (int r = 0; r < p; ++r) {
    for (Timeline::Slot& slot : slots[r]) {
      t.makespan = std::max(t.makespan, slot.end);
      t.slots.push_back(std::move(slot));
    }
  }
  return t;
}

// "F3", "B3", "b3" (input part), "W3"; with v > 1 also the chunk: "F3.1".
std::string Label(const Action& a, int p, int v) {
  const char* letter = a.kind == ActionKind::kForward         ? "F"
                       : a.kind == ActionKind::kBackward      ? "B"
                       : a.kind == ActionKind::kBackwardInput ? "b"
                                                              : "W";
  std::string label = absl::StrCat(letter, a.micro_batch);
  if (v > 1) absl::StrAppend(&label, ".", a.stage / p);
  return label;
}

}  // namespace

absl::string_view ScheduleName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kInterleaved1F1B:
      return "interleaved_1f1b";
    case ScheduleKind::kZeroBubble:
      return "zero_bubble";
  }
  return "?";
}

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name) {
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                         ScheduleKind::kInterleaved1F1B, ScheduleKind::kZeroBubble}) {
    if (name == ScheduleName(k)) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "schedule: unknown \"", name, "\"; use gpipe, 1f1b, interleaved_1f1b or zero_bubble"));
}

absl::string_view PayloadName(Payload payload) {
  return payload == Payload::kActivation ? "activation" : "gradient";
}

std::string Action::DebugString() const {
  switch (kind) {
    case ActionKind::kSend:
    case ActionKind::kReceive:
      return absl::StrCat(kind == ActionKind::kSend ? "send " : "recv ",
                          payload == Payload::kActivation ? "act" : "grad", " s", stage, " m",
                          micro_batch, kind == ActionKind::kSend ? " -> r" : " <- r", peer);
    default:
      return absl::StrCat(Label(*this, 1, 1), "@s", stage);
  }
}

absl::StatusOr<Schedule> MakeSchedule(const ScheduleOptions& o) {
  if (o.ranks < 1) return Invalid("ranks", absl::StrCat(o.ranks, " (must be >= 1)"));
  if (o.micro_batches < 1) {
    return Invalid("micro_batches", absl::StrCat(o.micro_batches, " (must be >= 1)"));
  }
  if (o.virtual_stages < 1) {
    return Invalid("virtual_stages", absl::StrCat(o.virtual_stages, " (must be >= 1)"));
  }
  const bool interleaved = o.kind == ScheduleKind::kInterleaved1F1B;
  if (interleaved && o.virtual_stages < 2) {
    return Invalid(
        "virtual_stages",
        absl::StrCat(o.virtual_stages, ": interleaved_1f1b needs 2 or more (with 1 it is 1f1b)"));
  }
  if (!interleaved && o.virtual_stages != 1) {
    return Invalid("virtual_stages", absl::StrCat(o.virtual_stages,
                                                  ": only interleaved_1f1b has "
                                                  "virtual stages; set 1 or that schedule"));
  }
  if (interleaved && o.micro_batches % o.ranks != 0) {
    return Invalid("micro_batches",
                   absl::StrCat(o.micro_batches, " is not a multiple of the ", o.ranks,
                                " pipeline ranks, which interleaved_1f1b needs"));
  }
  switch (o.kind) {
    case ScheduleKind::kGPipe:
      return WithMessages(o, GPipe(o.ranks, o.micro_batches));
    case ScheduleKind::kOneFOneB:
      return WithMessages(o, OneFOneB(o.ranks, o.micro_batches));
    case ScheduleKind::kInterleaved1F1B:
      return Interleaved(o);
    case ScheduleKind::kZeroBubble:
      return WithMessages(o, ZeroBubble(o.ranks, o.micro_batches));
  }
  return absl::InternalError("MakeSchedule: unknown kind");
}

absl::Status CheckSchedule(const Schedule& schedule) {
  if (absl::Status lists = CheckLists(schedule); !lists.ok()) return lists;
  if (absl::Status queued = Run(schedule, Costs{}).status(); !queued.ok()) return queued;
  return CheckRendezvous(schedule);
}

absl::StatusOr<Timeline> Simulate(const Schedule& schedule, const Costs& costs) {
  for (double c : {costs.forward, costs.backward_input, costs.backward_weight, costs.message}) {
    if (!(c >= 0) || !std::isfinite(c)) {
      return absl::InvalidArgumentError(absl::StrCat("Costs: ", c, " is not a finite time >= 0"));
    }
  }
  if (costs.forward + costs.backward_input + costs.backward_weight <= 0) {
    return absl::InvalidArgumentError("Costs: the forward and backward cannot all take no time");
  }
  return Run(schedule, costs);
}

double Timeline::Bubble() const {
  if (makespan <= 0 || busy.empty()) return 0;
  double idle = 0;
  for (double b : busy) idle += makespan - b;
  return idle / (static_cast<double>(busy.size()) * makespan);
}

double FormulaBubble(const ScheduleOptions& o, const Costs& c) {
  const double p = o.ranks, m = o.micro_batches, v = o.virtual_stages;
  switch (o.kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB:
      return (p - 1) / (m + p - 1);
    case ScheduleKind::kInterleaved1F1B:
      return (p - 1) / (v * m + p - 1);
    case ScheduleKind::kZeroBubble: {
      const double idle = (p - 1) * (c.forward + c.backward_input - c.backward_weight);
      return idle / (m * (c.forward + c.backward_input + c.backward_weight) + idle);
    }
  }
  return 0;
}

std::string TimelineText(const Schedule& schedule, const Timeline& timeline) {
  const int p = schedule.options.ranks, v = schedule.options.virtual_stages;
  double unit = kNever;
  size_t width = 1;
  for (const Timeline::Slot& slot : timeline.slots) {
    if (slot.end > slot.start) unit = std::min(unit, slot.end - slot.start);
    width = std::max(width, Label(slot.action, p, v).size());
  }
  if (unit == kNever) unit = 1;
  auto cells = [unit](double time) { return static_cast<long>(std::lround(time / unit)); };
  auto pad = [width](std::string text) {
    text.resize(width + 1, ' ');
    return text;
  };
  std::vector<std::string> rows(p);
  std::vector<long> filled(p, 0);
  for (const Timeline::Slot& slot : timeline.slots) {
    std::string& row = rows[slot.rank];
    for (; filled[slot.rank] < cells(slot.start); ++filled[slot.rank]) row += pad(".");
    for (; filled[slot.rank] < cells(slot.end); ++filled[slot.rank]) {
      row += pad(Label(slot.action, p, v));
    }
  }
  std::string out;
  for (int r = 0; r < p; ++r) {
    for (; filled[r] < cells(timeline.makespan); ++filled[r]) rows[r] += pad(".");
    while (!rows[r].empty() && rows[r].back() == ' ') rows[r].pop_back();
    absl::StrAppendFormat(&out, "rank %-3d %s\n", r, rows[r]);
  }
  absl::StrAppendFormat(&out, "bubble %.1f %% (formula %.1f %%); step %g time units\n",
                        100 * timeline.Bubble(), 100 * FormulaBubble(schedule.options),
                        timeline.makespan);
  std::vector<std::string> peaks;
  for (double a : timeline.peak_activations) peaks.push_back(absl::StrFormat("%g", a));
  absl::StrAppend(&out, "micro-batches of activations kept at most, per rank: ",
                  absl::StrJoin(peaks, " "), "\n");
  return out;
}

std::string TimelineSvg(const Schedule& schedule, const Timeline& timeline) {
  const int p = schedule.options.ranks, v = schedule.options.virtual_stages;
  const double scale = 720.0 / std::max(1e-9, timeline.makespan);  // px per time unit
  const int row = 28, left = 64, top = 36;
  const int width = left + 720 + 16, height = top + p * row + 24;
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%d\" y=\"20\" font-size=\"13\">%s, %d ranks, %d micro-batches%s: bubble "
      "%.1f %% (formula %.1f %%)</text>\n",
      width, height, left, ScheduleName(schedule.options.kind), p, schedule.options.micro_batches,
      v > 1 ? absl::StrCat(", ", v, " virtual stages") : "", 100 * timeline.Bubble(),
      100 * FormulaBubble(schedule.options));
  for (int r = 0; r < p; ++r) {
    absl::StrAppendFormat(&svg,
                          "<text x=\"8\" y=\"%d\">rank %d</text>\n"
                          "<rect x=\"%d\" y=\"%d\" width=\"720\" height=\"%d\" "
                          "fill=\"#eeeeee\"/>\n",
                          top + r * row + row / 2 + 4, r, left, top + r * row + 2, row - 4);
  }
  for (const Timeline::Slot& slot : timeline.slots) {
    const char* color = slot.action.kind == ActionKind::kForward          ? "#4e79a7"
                        : slot.action.kind == ActionKind::kBackwardWeight ? "#f28e2b"
                                                                          : "#59a14f";
    const double x = left + slot.start * scale, w = (slot.end - slot.start) * scale;
    const double opacity = 1.0 - 0.35 * (slot.action.stage / p) / std::max(1, v - 1);
    absl::StrAppendFormat(
        &svg,
        "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\" "
        "fill-opacity=\"%.2f\" stroke=\"white\"/>\n"
        "<text x=\"%.2f\" y=\"%d\" fill=\"white\" text-anchor=\"middle\">%s</text>\n",
        x, top + slot.rank * row + 2, w, row - 4, color, opacity, x + w / 2,
        top + slot.rank * row + row / 2 + 4, Label(slot.action, p, v));
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%d\" y=\"%d\">F forward, B backward, b input gradient, W "
                        "weight gradient; the number is the micro-batch</text>\n</svg>\n",
                        left, top + p * row + 16);
  return svg;
}

absl::StatusOr<BubbleSweep> SweepBubble(ScheduleKind kind, const std::vector<int>& ranks,
                                        int virtual_stages, double below) {
  if (!(below > 0 && below < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("below: ", below, " is not in (0, 1)"));
  }
  if (ranks.empty()) return Invalid("ranks", "none given");
  BubbleSweep sweep;
  sweep.kind = kind;
  sweep.virtual_stages = virtual_stages;
  sweep.below = below;
  const bool interleaved = kind == ScheduleKind::kInterleaved1F1B;
  auto bubble = [&](int p, int m) -> absl::StatusOr<double> {
    absl::StatusOr<Schedule> s = MakeSchedule({kind, p, m, virtual_stages});
    if (!s.ok()) return s.status();
    absl::StatusOr<Timeline> t = Simulate(*s);
    if (!t.ok()) return t.status();
    return t->Bubble();
  };
  for (int p : ranks) {
    for (int m = 1; m <= 256; m *= 2) {
      const int micro = interleaved ? m * p : m;
      if (interleaved && micro > 256) break;
      absl::StatusOr<double> b = bubble(p, micro);
      if (!b.ok()) return b.status();
      sweep.points.push_back({p, micro, *b, FormulaBubble({kind, p, micro, virtual_stages})});
    }
    int smallest = 0;
    for (int m = interleaved ? p : 1; m <= 4096; m += interleaved ? p : 1) {
      absl::StatusOr<double> b = bubble(p, m);
      if (!b.ok()) return b.status();
      if (*b < below) {
        smallest = m;
        break;
      }
    }
    sweep.smallest_below.push_back({p, smallest});
  }
  return sweep;
}

std::string SweepText(const BubbleSweep& sweep) {
  std::vector<int> ps, ms;
  for (const BubbleSweep::Point& pt : sweep.points) {
    if (std::find(ps.begin(), ps.end(), pt.ranks) == ps.end()) ps.push_back(pt.ranks);
    if (std::find(ms.begin(), ms.end(), pt.micro_batches) == ms.end())
      ms.push_back(pt.micro_batches);
  }
  std::sort(ms.begin(), ms.end());
  std::string out = absl::StrFormat(
      "%s%s: bubble (%% of the step) against micro-batches m, simulated with F = B = W; "
      "formula in brackets\n%-6s",
      ScheduleName(sweep.kind),
      sweep.virtual_stages > 1 ? absl::StrCat(", ", sweep.virtual_stages, " virtual stages") : "",
      "m");
  for (int p : ps) absl::StrAppendFormat(&out, "  %-16s", absl::StrCat("P=", p));
  while (out.back() == ' ') out.pop_back();
  out += "\n";
  for (int m : ms) {
    absl::StrAppendFormat(&out, "%-6d", m);
    for (int p : ps) {
      std::string cell;
      for (const BubbleSweep::Point& pt : sweep.points) {
        if (pt.ranks == p && pt.micro_batches == m) {
          cell = absl::StrFormat("%5.1f (%5.1f)", 100 * pt.bubble, 100 * pt.formula);
        }
      }
      absl::StrAppendFormat(&out, "  %-16s", cell.empty() ? "-" : cell);
    }
    while (out.back() == ' ') out.pop_back();
    out += "\n";
  }
  for (const auto& [p, m] : sweep.smallest_below) {
    absl::StrAppendFormat(&out, "P=%d: the bubble is below %g %% from m = %s\n", p,
                          100 * sweep.below, m > 0 ? absl::StrCat(m) : "(not up to 4096)");
  }
  return out;
}

std::string SweepSvg(const BubbleSweep& sweep) {
  const int left = 60, top = 40, w = 560, h = 320;
  int max_m = 1;
  for (const BubbleSweep::Point& pt : sweep.points) max_m = std::max(max_m, pt.micro_batches);
  const double log_max = std::max(1.0, std::log2(static_cast<double>(max_m)));
  auto x = [&](int m) { return left + w * std::log2(static_cast<double>(m)) / log_max; };
  auto y = [&](double b) { return top + h * (1 - b); };
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%d\" y=\"22\" font-size=\"13\">%s: pipeline bubble against micro-batches "
      "(simulated; formula dashed)</text>\n"
      "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n"
      "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n",
      left + w + 140, top + h + 50, left, ScheduleName(sweep.kind), left, top + h, left + w,
      top + h, left, top, left, top + h);
  for (int tick = 0; tick <= 10; tick += 2) {
    absl::StrAppendFormat(&svg, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%d %%</text>\n",
                          left - 6, y(tick / 10.0) + 4, tick * 10);
  }
  for (int m = 1; m <= max_m; m *= 2) {
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n",
                          x(m), top + h + 16, m);
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">micro-batches m</text>\n"
                        "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"grey\" "
                        "stroke-dasharray=\"2,3\"/>\n",
                        left + w / 2, top + h + 34, left, y(sweep.below), left + w, y(sweep.below));
  const char* colors[] = {"#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2"};
  int series = 0;
  for (const auto& [p, smallest] : sweep.smallest_below) {
    const char* color = colors[series % 6];
    std::string simulated, formula;
    for (const BubbleSweep::Point& pt : sweep.points) {
      if (pt.ranks != p) continue;
      absl::StrAppendFormat(&simulated, "%.1f,%.1f ", x(pt.micro_batches), y(pt.bubble));
      absl::StrAppendFormat(&formula, "%.1f,%.1f ", x(pt.micro_batches), y(pt.formula));
    }
    absl::StrAppendFormat(&svg,
                          "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" "
                          "stroke-width=\"2\"/>\n"
                          "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" "
                          "stroke-dasharray=\"5,4\"/>\n"
                          "<text x=\"%d\" y=\"%d\" fill=\"%s\">P = %d (below %g %% from m = "
                          "%d)</text>\n",
                          simulated, color, formula, color, left + w + 10, top + 14 + 16 * series,
                          color, p, 100 * sweep.below, smallest);
    ++series;
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace ringmaster::train::pipeline
