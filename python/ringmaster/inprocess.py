"""In-process recovery: a command job's training loop that survives a peer's failure.

Without it, ringmaster (as torchrun) restarts every rank's process when one rank fails: each
pays for a new interpreter, `import torch`, a rendezvous and a checkpoint read. A program that
opts in keeps its process instead. On a peer's failure the surviving ranks tear down their
process group, learn the new world from their runner, build a new group and go on from the
state they hold; only the lost rank's process is replaced, and the replacement joins at a
later step boundary with the state a survivor sends it. No re-import, no checkpoint read.

    import ringmaster.inprocess as inprocess

    group = inprocess.Group(state=lambda: {"model": model.state_dict(),
                                           "optimizer": optimizer.state_dict()},
                            load_state=lambda s: (model.load_state_dict(s["model"]),
                                                  optimizer.load_state_dict(s["optimizer"])))
    step = group.start(step)             # instead of init_process_group
    while step < steps:
        try:
            step = group.sync(step)      # the step boundary: a new world, agreed by all ranks
            if group.stop_requested:     # this rank's drain, or the job's end
                save(step); break
            train_one_step(step, group.rank, group.world_size)   # collectives as usual
            step += 1
        except group.errors as error:    # a peer failed under a collective
            step = group.recover(error, step)

Outside ringmaster (torchrun, plain python) start() is init_process_group(env://), sync()
does nothing, and recover() raises the error again: the program runs unchanged.

How it works, with the runner (worker/command_runner, worker/inprocess_world):
  - start() says hello with "inprocess": true; the runner answers with the epoch's world
    ({"type": "world", epoch, rank, world_size, master_addr, master_port, ...}); the program
    builds its process group from it (rank 0 of the epoch hosts the TCP store at the port
    its runner picked, fresh for every epoch), agrees on the state (below) and says
    {"type": "world_done", "epoch": N}, which its runner reports to the coordinator as Ready.
  - A peer's process dies (kill -9): the survivors' collectives raise at once for the ranks
    connected to it and, once those destroy their group (closing its connections), for the
    others; `timeout_s` bounds the rest (a frozen peer). recover() destroys the group and
    waits for a world newer than the one it had. The dead rank's runner told the coordinator
    (ReportError with rejoin): it re-forms the job WITHOUT that slot at once (one restart of
    the budget, as a whole-group restart costs), so the survivors go on among themselves
    while the replacement (`import torch` alone takes over a second) starts.
  - The replacement's runner restarts the program; its start() says hello and waits; its
    runner then joins the job's epoch, which grows the job by it (no budget spent). Every
    rank's runner sends the new world. The survivors are training: they switch at a step
    boundary that all agree on: sync() all-reduces (MAX) minus the latest epoch each has
    received, so every rank learns at the same step the newest world that every rank has,
    and switches.
  - A stop (the runner's stop message or SIGTERM: a drain of this rank's node, the job's
    end) is this rank's: sync() and recover() return at once with stop_requested set, the
    program saves if it keeps checkpoints (any rank's state is the whole model's) and exits
    0. Its peers, when the job goes on, see it leave as any departure: their runners bring
    them the world without it.
  - The state after a new group: the ranks all-gather their steps; when they differ (a
    replacement has none; a survivor may have finished one more step than another when the
    failure came between their collectives), the lowest rank holding the highest step
    broadcasts its state (state(), broadcast_object_list) and its step to all.
  - A world that never comes (a transient error no peer's failure explains): recover()
    raises the error after `world_timeout_s`; the program exits non-zero and ringmaster
    handles it as any failure.
Where the process group is not whole for a reason the runner cannot see, the program's
`timeout_s` decides how soon a collective gives up: keep it above the longest step.

Only the standard library is imported here; torch is imported when start() runs.
"""

import datetime
import gc
import os
import queue
import socket
import time

import ringmaster

__all__ = ["Group"]

# Messages of errors a collective raises when a peer is gone or the group was torn down.
_COLLECTIVE_ERROR_MARKERS = ("gloo", "connection", "timed out", "timeout", "nccl",
                             "broken pipe", "reset by peer", "process group", "store")


class _NoWorld(Exception):
    """No newer world came within world_timeout_s."""


class _Stopped(Exception):
    """This rank was asked to stop while it waited for a world."""


class Group:
    """A data-parallel group that a peer's failure does not end (see the module's doc).

    state(): what a newcomer needs (a picklable object: state dicts of tensors);
    load_state(obj): takes it. on_new_group(): called after every new process group (e.g. to
    wrap the model in DistributedDataParallel again). backend: "gloo" (CPU) or "nccl".
    timeout_s: the process group's timeout, for collectives and its store. world_timeout_s:
    how long recover() waits for a new world before it gives up.
    """

    def __init__(self, state, load_state, on_new_group=None, backend="gloo", timeout_s=5.0,
                 world_timeout_s=300.0):
        self._state = state
        self._load_state = load_state
        self._on_new_group = on_new_group
        self._backend = backend
        self._timeout_s = float(timeout_s)
        self._world_timeout_s = float(world_timeout_s)
        self._worlds = {}        # epoch -> the runner's world message, not yet used
        self._queue = None       # the runner's world messages (None outside ringmaster)
        self._world = None       # the world in use
        self.stop_requested = False
        self.errors = (RuntimeError,)  # what a failed collective raises (torch's errors)
        self.recoveries = 0
        self.last_recovery_s = None    # from the error to the new group, state agreed

    # --- what the program reads ---
    @property
    def rank(self):
        import torch.distributed as dist
        if dist.is_initialized():
            return dist.get_rank()
        return int(self._world["rank"]) if self._world else ringmaster.rank()

    @property
    def world_size(self):
        import torch.distributed as dist
        if dist.is_initialized():
            return dist.get_world_size()
        return int(self._world["world_size"]) if self._world else ringmaster.world_size()

    @property
    def epoch(self):
        """The membership epoch of the current group (0 outside ringmaster)."""
        return self._world["epoch"] if self._world else 0

    # --- the loop's calls ---
    def start(self, step=0):
        """Joins the job's world (a replacement: when the survivors let it in) and returns the
        step to train from: `step`, or the newest a peer holds (its state then loaded).
        Returns `step` with stop_requested set, and no group, when asked to stop meanwhile;
        raises RuntimeError when the runner sends no world within world_timeout_s."""
        import torch.distributed as dist
        if self._enabled():
            try:
                world = self._await_world(newer_than=0)
            except _Stopped:
                return step
            except _NoWorld:
                raise RuntimeError(f"ringmaster.inprocess: no world from the runner within "
                                   f"{self._world_timeout_s} s") from None
            return self._build(world, step)
        dist.init_process_group(self._backend, init_method="env://",
                                timeout=datetime.timedelta(seconds=self._timeout_s))
        self._new_group_hook()
        return step

    def sync(self, step):
        """The step boundary: every rank learns, at the same step, whether a newer world is
        here for all; then switches to it (returning the step the group goes on from). A
        failed peer raises here as in any collective (catch self.errors and call recover()).
        Sets stop_requested, doing nothing else, when this rank was asked to stop."""
        import torch
        import torch.distributed as dist
        if self._stopping():
            return step
        if self._queue is None:
            return step  # outside ringmaster: no world but torchrun's
        while True:
            # Every rank, in every group, begins with this all-reduce after start(), sync()
            # and recover(): a newcomer's first collective meets the survivors' first one in
            # the new group (so after a switch, sync() all-reduces again, in the new group).
            self._drain_queue()
            latest = max(self._worlds) if self._worlds else self.epoch
            flags = torch.tensor([-float(latest)])
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            target = int(-flags[0].item())  # the newest world every rank has received
            if target <= self.epoch:
                return step
            world = self._worlds.get(target)
            if world is None:  # this rank skipped that epoch: it cannot take part
                raise RuntimeError(
                    f"ringmaster.inprocess: the group moves to epoch {target}, which this "
                    f"rank never received (it has {sorted(self._worlds)})")
            self._teardown()
            step = self._build(world, step)

    def recover(self, error, step):
        """After a collective raised `error`: tears the process group down, waits for the new
        world, builds it and agrees on the state; returns the step to go on from. Raises
        `error` again when it is not a collective's failure, outside ringmaster, or when no
        new world comes within world_timeout_s. Returns `step` at once, stop_requested set and
        no group, when this rank is asked to stop meanwhile."""
        if self._queue is None or not _is_collective_error(error):
            raise error
        began = time.monotonic()
        # The frames of the failed collective, kept by the error's traceback, hold the broken
        # group: while they live, destroying it closes none of its connections, and a peer
        # that was waiting on this rank (not on the dead one) waits out the group's timeout.
        error.__traceback__ = None
        self._teardown()
        try:
            world = self._await_world(newer_than=self.epoch)
        except _NoWorld:
            raise error
        except _Stopped:
            return step
        step = self._build(world, step)
        self.recoveries += 1
        self.last_recovery_s = time.monotonic() - began
        return step

    # --- inside ---
    def _enabled(self):
        if self._queue is not None:
            return True
        if not ringmaster.enabled():
            return False
        self._queue = ringmaster._subscribe("world")
        ringmaster._set_inprocess(True)
        return True

    def _stopping(self):
        if not self.stop_requested and self._queue is not None and ringmaster.stop_requested():
            self.stop_requested = True
        return self.stop_requested

    def _drain_queue(self):
        if self._queue is None:
            return
        while True:
            try:
                world = self._queue.get_nowait()
            except queue.Empty:
                return
            self._keep(world)

    def _keep(self, world):
        epoch = int(world.get("epoch", 0))
        if epoch > self.epoch:
            self._worlds[epoch] = world

    def _await_world(self, newer_than):
        """The newest world after `newer_than`, waiting for one up to world_timeout_s."""
        deadline = time.monotonic() + self._world_timeout_s
        self._drain_queue()
        while not any(e > newer_than for e in self._worlds):
            if self._stopping():
                raise _Stopped()
            left = deadline - time.monotonic()
            if left <= 0:
                raise _NoWorld()
            try:
                self._keep(self._queue.get(timeout=min(left, 0.1)))
            except queue.Empty:
                pass
        self._drain_queue()  # the newest, when several came (a growth right after a failure)
        return self._worlds[max(self._worlds)]

    def _teardown(self):
        import torch.distributed as dist
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as e:  # a group that a dead peer broke may not close cleanly
                ringmaster._warn(f"destroying the process group: {e}")
            gc.collect()  # what still holds the group in a cycle: its connections close now

    def _build(self, world, step):
        """The process group of `world`, then the state agreed; returns the step."""
        import torch.distributed as dist
        epoch = int(world["epoch"])
        for e in [e for e in self._worlds if e <= epoch]:
            del self._worlds[e]
        addr, port = world["master_addr"], int(world["master_port"])
        if int(world["rank"]) != 0:
            # torch's store client waits a second between its tries to connect: a rank that
            # comes before rank 0 has opened the store would lose that second.
            _await_listening(addr, port, time.monotonic() + self._timeout_s)
        dist.init_process_group(
            self._backend, init_method=f"tcp://{_host(addr)}:{port}",
            rank=int(world["rank"]), world_size=int(world["world_size"]),
            timeout=datetime.timedelta(seconds=self._timeout_s))
        self._world = world
        ringmaster._world = world
        step = self._agree_on_state(step)
        self._new_group_hook()
        ringmaster._send({"type": "world_done", "epoch": epoch})
        return step

    def _agree_on_state(self, step):
        """The lowest rank holding the highest step sends its state and step to all, when
        the ranks' steps differ; returns the group's step."""
        import torch
        import torch.distributed as dist
        world = dist.get_world_size()
        steps = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(steps, torch.tensor([step], dtype=torch.int64))
        steps = [int(s.item()) for s in steps]
        if len(set(steps)) == 1:
            return step
        newest = max(steps)
        source = steps.index(newest)
        box = [(newest, self._state()) if dist.get_rank() == source else None]
        dist.broadcast_object_list(box, src=source)
        if dist.get_rank() != source:
            newest, state = box[0]
            self._load_state(state)
        return newest

    def _new_group_hook(self):
        if self._on_new_group is not None:
            self._on_new_group()


def _is_collective_error(error):
    text = str(error).lower()
    return any(marker in text for marker in _COLLECTIVE_ERROR_MARKERS)


def _await_listening(addr, port, deadline):
    """Until something listens at addr:port (rank 0's store), polling every 5 ms, or the
    deadline (then init_process_group's own tries and timeout take over)."""
    while time.monotonic() < deadline:
        try:
            socket.create_connection((addr, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.005)


def _host(addr):
    """An address for a tcp:// URL (IPv6 in brackets)."""
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
