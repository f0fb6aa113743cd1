"""Devices and torch.distributed for `train-drafter`: which process this is, on which device, and the few
collectives training needs (torch.distributed's own; nothing home-made).

`torchrun` starts one process per rank and sets RANK / WORLD_SIZE / LOCAL_RANK (and the rendezvous address);
`launched` reads them, joins the process group (gloo on CPU, nccl on CUDA) and leaves it at the end. A process
started without torchrun is rank 0 of 1 and joins no group: every helper below is then a no-op returning its input,
so the single-process path does exactly what it did before distributed training existed.

The rules that keep results independent of the world size W (see trainer.train):
  * every rank draws the same global batch from one identically seeded generator and keeps rows
    [rank * B/W, (rank + 1) * B/W) of it (`rows`): B must be a multiple of W (`check_batch`);
  * the loss is a mean over rows, so with equal parts the mean of the rank means is the global mean, and DDP's
    average of the rank gradients is the gradient of the global batch (no extra scaling);
  * work split by item (teacher shards, regeneration batches: `owns`) is written by its one owner, then `barrier`.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator, TypeVar

import torch
import torch.distributed as tdist

from edge_spec.errors import ConfigError

T = TypeVar("T")
# a barrier waits for the slowest rank's share of the teacher pass (or rank 0's vocabulary clustering): generous
TIMEOUT = datetime.timedelta(minutes=60)


@dataclass(frozen=True)
class Dist:
    """This process: its rank among world_size, its rank on its node and its device. `Dist()` = one CPU process."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        """Rank 0: the one that prints, writes checkpoints and the drafter."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        """A process group is up (more than one rank)."""
        return self.world_size > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """'cpu' | 'cuda' | 'auto' (cuda when torch sees a GPU) -> this rank's device (cuda:LOCAL_RANK)."""
    if name not in ("cpu", "cuda", "auto"):
        raise ConfigError(f"unknown device {name!r}", "pass --device cpu, cuda or auto")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"--device cuda: this torch ({torch.__version__}) sees no CUDA GPU",
                          "install a CUDA build of torch on a GPU machine, or pass --device cpu (or auto)")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise ConfigError(f"local rank {local_rank} has no GPU: this node has {count}",
                          f"launch at most {count} processes per node (torchrun --nproc_per_node {count})")
    return torch.device("cuda", local_rank)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    try:
        return default if value is None else int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer",
                          "launch with torchrun (it sets RANK, WORLD_SIZE and LOCAL_RANK), or unset it") from None


@contextlib.contextmanager
def launched(device: str = "auto") -> Iterator[Dist]:
    """This process as torchrun started it (or alone): joins the process group for the block, leaves it after.
    Ranks other than 0 print nothing but errors (no warnings, no notices; progress bars are the callers')."""
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local = _env_int("LOCAL_RANK", 0)
    dev = resolve_device(device, local)
    if world <= 1:
        yield Dist(device=dev)
        return
    if rank:
        warnings.simplefilter("ignore")
        logging.getLogger("edge_spec").setLevel(logging.ERROR)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        tdist.init_process_group("nccl", timeout=TIMEOUT, device_id=dev)
    else:
        tdist.init_process_group("gloo", timeout=TIMEOUT)
    try:
        yield Dist(rank, world, local, dev)
    except BaseException as err:
        # a failing rank just exits: torchrun stops the others (perhaps waiting in a collective) and names this
        # rank's error as the root cause in its summary
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(err)
        raise
    tdist.destroy_process_group()


def check_batch(batch_seqs: int, world_size: int) -> None:
    """The global batch is split evenly over the ranks, or results would depend on the world size."""
    if batch_seqs % world_size:
        up = -(-batch_seqs // world_size) * world_size
        raise ConfigError(f"--batch-seqs {batch_seqs} does not split evenly over {world_size} ranks (each rank takes "
                          f"batch-seqs / world size sequences of the same global batch)",
                          f"pass a --batch-seqs that is a multiple of {world_size} (e.g. {up}), or launch a number "
                          f"of ranks that divides {batch_seqs} (torchrun --nproc_per_node)")


def rows(batch_seqs: int, d: Dist) -> slice:
    """This rank's rows of a global batch of `batch_seqs` sequences."""
    check_batch(batch_seqs, d.world_size)
    part = batch_seqs // d.world_size
    return slice(d.rank * part, (d.rank + 1) * part)


def owns(index: int, d: Dist) -> bool:
    """Items (shards, regeneration batches) are dealt round-robin: item i is rank i mod W's to compute and write."""
    return index % d.world_size == d.rank


def barrier(d: Dist) -> None:
    if d.active:
        tdist.barrier(device_ids=[d.device.index] if d.device.type == "cuda" else None)


def main_first(d: Dist, fn: Callable[[], T]) -> T:
    """Rank 0 runs `fn` (which writes a cache), then the others run it (and find the cache): one writer, no race."""
    if d.main:
        out = fn()
    barrier(d)
    if not d.main:
        out = fn()
    return out


def agree(d: Dist, value: T) -> T:
    """Rank 0's `value` on every rank (a choice that must not differ between ranks, e.g. a timed one)."""
    if not d.active:
        return value
    box = [value]
    tdist.broadcast_object_list(box, src=0, device=d.device if d.device.type == "cuda" else None)
    return box[0]


def sum_over_ranks(d: Dist, values: list[float]) -> list[float]:
    """Element-wise sum over ranks of one float vector (one all_reduce, fp64 so sums of means stay exact-ish)."""
    if not d.active:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return t.tolist()


def wrap(module: torch.nn.Module, d: Dist) -> torch.nn.Module:
    """DDP around `module` when there are several ranks (its forward must run the loss: DDP syncs the gradients
    of what its forward ran); the module itself otherwise. Parameters are already identical on every rank."""
    if not d.active:
        return module
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(module, device_ids=[d.device.index] if d.device.type == "cuda" else None,
                                   forward_sync_buffers=False)  # identical buffers (a derived table can be large)
