// How fully sharded data parallelism (ZeRO-2/3) cuts a model's flat index space into units
// and each unit among the ranks, after PyTorch FSDP's FlatParameter: a unit is a run of
// consecutive parameter groups (train/model.h ParameterGroup) whose flat range is padded to
// a multiple of world × kAlignElements and split into `world` equal pieces; rank r keeps the
// r-th piece of every unit, back to back, in its shard buffer (the parameters' fp32 master
// copy, the gradients and the optimizer state). Gathering a unit is one all-gather of the
// pieces, reducing its gradients one reduce-scatter; each moves (world − 1) / world of the
// unit per rank.
//
// The units tile [0, table.total_elements()) (padding between tensors belongs to the unit
// before it), so the ranks' pieces, cut back to their unit's range, tile the flat index space
// too: a checkpoint of them loads under any other stage and world size.
#ifndef RINGMASTER_TRAIN_FSDP_LAYOUT_H_
#define RINGMASTER_TRAIN_FSDP_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "state/range.h"
#include "state/tensor.h"
#include "train/config.h"
#include "train/model.h"

namespace ringmaster::train {

struct FsdpUnit {
  std::string name;                    // "h3" (block), "h3.attn.qkv" (layer), "model", ...
  int first_group = 0, end_group = 0;  // the model's parameter groups [first, end)
  state::FlatRange range;              // its part of the flat index space
  int64_t padded = 0;  // range.size() rounded up to a multiple of world × kAlignElements
  int64_t shard = 0;   // padded / world: each rank's piece
  int64_t local = 0;   // where the pieces start in a rank's shard buffer
  // Whether backward reads its parameters (not for the embeddings, nor a network's first
  // layer: no input gradient), i.e. whether it is gathered for backward.
  bool backward_reads_parameters = true;
  // Whether one of its groups is read again by the LM head (ParameterGroup::read_again_by_head):
  // then it stays gathered from its first use in forward until its gradients are final (no
  // second gather for backward).
  bool kept_through_pass = false;
  // Whether its gradients are written over its gathered parameters in backward: every group
  // has ParameterGroup::gradients_over_parameters and none is read again by the head.
  bool gradients_in_place = false;
  // The parts of [range.begin, range.begin + padded) that no tensor covers (the padding after
  // tensors and the unit's tail): zero in the parameters, and zeroed in a gradient buffer
  // that was the parameters' (they are reduced with the rest).
  std::vector<state::FlatRange> gaps;

  // Rank r's piece of the flat space: [begin + r·shard, begin + (r+1)·shard) cut back to
  // `range` (empty for a rank whose piece is all padding).
  state::FlatRange Piece(int rank) const;
};

struct FsdpLayout {
  int world = 1;
  std::vector<FsdpUnit> units;   // in forward order
  std::vector<int> unit_of_group;  // per parameter group
  int64_t local_elements = 0;    // a rank's shard buffer: the units' shards together
  int64_t largest_unit = 0;      // the largest padded unit (a gathered unit's buffer)

  // Rank r's pieces: unit u's Piece(r) at local offset units[u].local.
  std::vector<state::PlacedRange> Placement(int rank) const;
  // "12 units (block), largest 1.2 MiB"
  std::string Describe() const;
};

// Units by wrapping policy: one per parameter group (kLayer), per block (kBlock), or one
// for the whole model (kModel). `groups` must hold the table's tensors in order, each once
// (INTERNAL otherwise: a model's bug); world >= 1.
absl::StatusOr<FsdpLayout> MakeFsdpLayout(const state::TensorTable& table,
                                          const std::vector<ParameterGroup>& groups,
                                          FsdpConfig::Wrap wrap, int world);

// Units of at least `bucket_elements` each (consecutive groups merged until they reach it;
// the last may be smaller): ZeRO-2's gradient buckets.
absl::StatusOr<FsdpLayout> MakeBucketLayout(const state::TensorTable& table,
                                            const std::vector<ParameterGroup>& groups,
                                            int64_t bucket_elements, int world);

// What one rank sends in one micro-batch pass of ZeRO-3 by the formula (ring collectives
// move (world − 1) / world of a unit per rank): every unit is all-gathered before its
// forward and, being freed after it (reshard_after_forward), again before its backward,
// except the last unit in forward order, which backward uses first and which stays, and the
// units whose backward does not read their parameters (the embeddings); every
// unit's gradients are reduce-scattered once. Elements cross the wire in `gather_bytes`
// (4 for fp32, 2 for bf16/fp16 compute) and `reduce_bytes` each.
struct PassTraffic {
  int64_t all_gather_bytes = 0;
  int64_t reduce_scatter_bytes = 0;
};
PassTraffic Zero3PassTraffic(const FsdpLayout& layout, bool reshard_after_forward,
                             int gather_bytes, int reduce_bytes);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_FSDP_LAYOUT_H_
