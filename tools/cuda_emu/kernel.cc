// The emulated grid: a launch is queued on its stream (cudart.cc); there each CUDA thread of a
// block is a fiber on the stream's worker thread, run until it exits or waits at a barrier;
// blocks run in order. One kernel runs at a time in the process (kernel_mutex), so
// function-static __shared__ arrays stay per block.
//
// A fiber switch is a few instructions (SwitchStack below: the callee-saved registers and the
// floating-point control words), not ucontext's, whose signal-mask system calls made a
// million-thread grid take tens of seconds.
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "tools/cuda_emu/cuda_emu.h"
#include "tools/cuda_emu/internal.h"

namespace rm_emu {
namespace {

constexpr size_t kStackBytes = 512 << 10;  // reserved; the kernel touches what it uses
constexpr int kMaxThreadsPerBlock = 1024;
constexpr size_t kDefaultSharedLimit = 48 << 10;
constexpr size_t kOptInSharedLimit = 227 << 10;  // an H100's per-block opt-in maximum

enum class State { kRunnable, kBlockBarrier, kWarpBarrier, kDone };

struct Fiber {
  void* sp = nullptr;  // its saved stack pointer while it is switched out
  void* stack = nullptr;
  uint3 thread_idx;
  int linear = 0;
  State state = State::kRunnable;
  uint32_t warp_mask = 0;  // the mask it waits on at a warp barrier
};

struct Warp {
  unsigned char deposits[32][kSlotBytes];
  unsigned char published[32][kSlotBytes];
};

struct Block {
  dim3 grid, block;
  uint3 block_idx;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  std::vector<unsigned char> dynamic_shared;
  const std::function<void()>* body = nullptr;
  void* scheduler_sp = nullptr;
  Fiber* current = nullptr;
};

std::mutex kernel_mutex;
Block* running = nullptr;   // guarded by kernel_mutex while a grid runs
std::vector<void*> stacks;  // kept between launches

[[noreturn]] void Fatal(const char* what) {
  std::fprintf(stderr, "cuda_emu: %s (block (%u,%u,%u), thread (%u,%u,%u))\n", what,
               running->block_idx.x, running->block_idx.y, running->block_idx.z,
               running->current->thread_idx.x, running->current->thread_idx.y,
               running->current->thread_idx.z);
  std::abort();
}

// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack,
// stores the stack pointer in *save, and resumes the stack `to` saved the same way.
extern "C" void RmEmuSwitchStack(void** save, void* to);
asm(R"(
  .text
  .p2align 4
  .type RmEmuSwitchStack, @function
RmEmuSwitchStack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size RmEmuSwitchStack, .-RmEmuSwitchStack
)");

void Yield() { RmEmuSwitchStack(&running->current->sp, running->scheduler_sp); }

[[noreturn]] void FiberMain() {
  (*running->body)();
  running->current->state = State::kDone;
  RmEmuSwitchStack(&running->current->sp, running->scheduler_sp);
  std::abort();  // a finished fiber is never resumed
}

// A fresh fiber's stack as RmEmuSwitchStack leaves one: the control words, six registers and
// FiberMain as the return address, aligned as if FiberMain had been called.
void* FreshStack(void* stack) {
  auto* top = reinterpret_cast<uint64_t*>(static_cast<char*>(stack) + kStackBytes);
  *--top = 0;  // FiberMain's own (never used) return address
  // At a function's entry rsp + 8 is 16-byte aligned: the `ret` into FiberMain pops this
  // slot, which therefore sits at a multiple of 16.
  *--top = reinterpret_cast<uint64_t>(&FiberMain);
  for (int i = 0; i < 6; ++i) *--top = 0;  // rbp, rbx, r12-r15
  uint32_t mxcsr;
  uint16_t fpu_cw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpu_cw));
  --top;
  std::memcpy(top, &mxcsr, 4);
  std::memcpy(reinterpret_cast<char*>(top) + 4, &fpu_cw, 2);
  return top;
}

void* Stack(size_t i) {
  while (stacks.size() <= i) {
    void* s = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s == MAP_FAILED) {
      std::fprintf(stderr, "cuda_emu: mmap of a fiber stack failed\n");
      std::abort();
    }
    stacks.push_back(s);
  }
  return stacks[i];
}

// Releases the lanes of `mask` in `warp` if every one of them waits at the warp barrier.
void MaybeReleaseWarp(Block& b, int warp, uint32_t mask) {
  const int first = warp * 32;
  const int count = std::min<int>(32, static_cast<int>(b.fibers.size()) - first);
  for (int l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    if (l >= count) {
      running->current = &b.fibers[first];
      Fatal("a warp operation's mask names a lane beyond the block's threads");
    }
    const Fiber& f = b.fibers[first + l];
    if (f.state == State::kDone) {
      Fatal("a warp operation's mask names a lane that has exited");
    }
    if (f.state != State::kWarpBarrier) return;  // not there yet
  }
  std::memcpy(b.warps[warp].published, b.warps[warp].deposits, sizeof(Warp::published));
  for (int l = 0; l < 32; ++l) {
    if (mask >> l & 1u) b.fibers[first + l].state = State::kRunnable;
  }
}

void RunBlock(Block& b) {
  const int n = static_cast<int>(b.fibers.size());
  for (int i = 0; i < n; ++i) {
    Fiber& f = b.fibers[i];
    f.state = State::kRunnable;
    f.sp = FreshStack(f.stack);
  }
  std::fill(b.dynamic_shared.begin(), b.dynamic_shared.end(), 0xff);
  while (true) {
    bool ran = false;
    for (int i = 0; i < n; ++i) {
      Fiber& f = b.fibers[i];
      if (f.state != State::kRunnable) continue;
      b.current = &f;
      RmEmuSwitchStack(&b.scheduler_sp, f.sp);
      ran = true;
    }
    if (ran) continue;
    int live = 0, at_block = 0;
    for (const Fiber& f : b.fibers) {
      if (f.state != State::kDone) ++live;
      if (f.state == State::kBlockBarrier) ++at_block;
    }
    if (live == 0) return;
    if (at_block == live) {
      for (Fiber& f : b.fibers) {
        if (f.state == State::kBlockBarrier) f.state = State::kRunnable;
      }
      continue;
    }
    for (Fiber& f : b.fibers) {
      if (f.state != State::kDone) {
        b.current = &f;
        break;
      }
    }
    Fatal(at_block > 0 ? "deadlock: some threads wait at __syncthreads, others at a warp "
                         "operation"
                       : "deadlock: a warp operation waits for lanes that never arrive");
  }
}

}  // namespace

const uint3& ThreadIdx() { return running->current->thread_idx; }
const uint3& BlockIdx() { return running->block_idx; }
const dim3& BlockDim() { return running->block; }
const dim3& GridDim() { return running->grid; }
void* DynamicShared() { return running->dynamic_shared.data(); }
int LaneId() { return running->current->linear % 32; }

void SyncThreads() {
  running->current->state = State::kBlockBarrier;
  Yield();
}

void WarpExchange(uint32_t mask, const void* value, size_t bytes,
                  unsigned char (*lanes)[kSlotBytes]) {
  Block& b = *running;
  Fiber& f = *b.current;
  const int warp = f.linear / 32, lane = f.linear % 32;
  if (!(mask >> lane & 1u)) Fatal("a warp operation's mask leaves out the calling lane");
  for (int l = 0; l < 32 && warp * 32 + l < static_cast<int>(b.fibers.size()); ++l) {
    const Fiber& other = b.fibers[warp * 32 + l];
    if (other.state == State::kWarpBarrier && other.warp_mask != mask &&
        (other.warp_mask & mask) != 0) {
      Fatal("lanes of one warp wait on different, overlapping warp masks");
    }
  }
  std::memcpy(b.warps[warp].deposits[lane], value, bytes);
  f.state = State::kWarpBarrier;
  f.warp_mask = mask;
  MaybeReleaseWarp(b, warp, mask);
  if (f.state != State::kRunnable) Yield();
  std::memcpy(lanes, b.warps[warp].published, sizeof(Warp::published));
}

void RunGrid(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, const void* kernel,
             std::function<void()> body) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > kMaxThreadsPerBlock || block.z > 64 || grid.x == 0 || grid.y == 0 ||
      grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
    SetLastError(cudaErrorInvalidConfiguration);
    return;
  }
  if (shared_bytes > std::max(kDefaultSharedLimit, MaxDynamicShared(kernel)) ||
      shared_bytes > kOptInSharedLimit) {
    SetLastError(cudaErrorInvalidValue);
    return;
  }
  const cudaError_t queued =
      Enqueue(stream, [grid, block, shared_bytes, threads, body = std::move(body)] {
        std::lock_guard<std::mutex> lock(kernel_mutex);
        Block b;
        b.grid = grid;
        b.block = block;
        b.body = &body;
        b.fibers.resize(threads);
        b.warps.resize((threads + 31) / 32);
        b.dynamic_shared.resize(shared_bytes);
        for (uint64_t i = 0; i < threads; ++i) {
          Fiber& f = b.fibers[i];
          f.linear = static_cast<int>(i);
          f.thread_idx = {static_cast<unsigned>(i % block.x),
                          static_cast<unsigned>(i / block.x % block.y),
                          static_cast<unsigned>(i / (uint64_t{block.x} * block.y))};
          f.stack = Stack(i);
        }
        running = &b;
        for (unsigned z = 0; z < grid.z; ++z) {
          for (unsigned y = 0; y < grid.y; ++y) {
            for (unsigned x = 0; x < grid.x; ++x) {
              b.block_idx = {x, y, z};
              RunBlock(b);
            }
          }
        }
        running = nullptr;
      });
  if (queued != cudaSuccess) SetLastError(queued);
}

}  // namespace rm_emu
