"""A loader configuration drawn from a seed: each lever of DataLoaderX is one axis of the draw.

Axes (documented in tests/oracle/test_oracle.py): the dataset (map-style, IterableDataset with and without
state, fastloader's ImageFolder over real images with random transforms, a dataset whose sample SIGKILLs its
worker once or every time), the order (sequential, ``shuffle=True`` with the global RNG, ``generator=``,
``seed=``, WeightedRandomSampler, DistributedSampler, a sampler of numpy integers, a batch sampler of tuples
or arrays), ``batch_size``, ``drop_last``, ``num_workers`` 0-3, ``persistent_workers``, ``in_order``,
``prefetch_factor``, the error policy, the decoded cache, ``exact_decode``, the loop (plain, ``set_epoch``,
epochs cut short), a worker SIGKILLed while idle or while blocked writing its result, a resume at a random batch of a
random epoch, loaded in a fresh loader with another ``batch_size`` or ``num_workers``, or on another number of ranks
(``ranks`` → ``resume_ranks``: simulated ranks in one process, each its own loader over the split of its rank), and
``worker_method`` ("process", "thread", "subprocess" or "ray", for the run and, independently, for the resumed loader:
a state moves between the modes; "ray": actors that answer in any order and die now and then, inside this process,
tests/oracle/fake_ray.py). Thread workers and the subprocess pipeline are not drawn with a sample or a signal that
kills a worker: that would kill the test's process, or every worker of the pipeline at once. Over the images:
``confine`` (reads confined to the folder's root) and ``outside_link`` (the folder holds a symbolic link, alone in its
class, to an image outside the root).
"""

from __future__ import annotations

import dataclasses
import random

DATASETS = ("map", "stream", "stateful_stream", "images", "killer_once", "killer_always")
ORDERS = ("sequential", "shuffle", "generator", "seed", "weighted", "distributed", "numpy", "tuples", "arrays")
MAP_STYLE = ("map", "images", "killer_once", "killer_always")
RESTARTS = ("killer_once", "killer_always", "images")  # datasets whose error policy restarts dead workers
# Orders whose resume DataLoaderX refuses (nothing records a user sampler's position): the oracle checks the
# refusal is a ValueError that says so, never a wrong epoch.
UNRESUMABLE = ("numpy", "tuples", "arrays")


def _worker_method(rng: random.Random, workers: int, killers: bool) -> str:
    """One draw: threads, the subprocess pipeline or worker processes (never without workers, nor where a sample
    or a signal kills a worker: a thread's death is the test's process's, the pipeline's is all its workers')."""
    if workers == 0 or killers:
        return "process"
    draw = rng.random()
    return "thread" if draw < 0.4 else "subprocess" if draw < 0.65 else "process"


@dataclasses.dataclass(frozen=True)
class Case:
    seed: int
    dataset: str
    size: int
    order: str
    batch_size: int
    drop_last: bool
    workers: int
    persistent: bool
    in_order: bool
    prefetch: int | None
    policy: str  # the image dataset's on_error; the killers' are skip (always) or skip / replace (once)
    cache: bool
    exact: bool
    loop: str  # "plain", "set_epoch", "cut"
    cut: int  # batches per epoch when the loop cuts epochs short
    epochs: int
    kill: tuple[int, int] | None  # (epoch, batch) after which a worker is SIGKILLed
    kill_how: str  # "idle" (likely), "writing" (blocked writing a result bigger than a pipe: the loop waits for it)
    resume: tuple[int, int] | None  # (epoch, batch) at which the state is taken
    resume_batch_size: int
    resume_workers: int
    ranks: int = 1  # > 1: the case runs on that many simulated ranks (orders "seed" and "distributed")
    resume_ranks: int = 1
    worker_method: str = "process"
    resume_worker_method: str = "process"
    confine: bool = False  # the images: ImageFolder(..., confine=True)
    outside_link: bool = False  # the images: a link to an image outside the root, alone in the last class

    def describe(self) -> str:
        fields = dataclasses.asdict(self)
        return ", ".join(f"{key}={value!r}" for key, value in fields.items())


def draw(seed: int) -> Case:
    rng = random.Random(seed)
    # The dataset and the order cycle with the seed (every value within the first few dozen seeds); the
    # other axes are drawn.
    dataset = DATASETS[seed % len(DATASETS)]
    map_style = dataset in MAP_STYLE
    size = rng.randint(12, 30) if dataset != "images" else rng.randint(10, 16)
    order = ORDERS[(seed + seed // len(DATASETS)) % len(ORDERS)] if map_style else "sequential"
    if dataset in ("killer_once", "killer_always") and order in ("tuples", "arrays", "weighted"):
        order = "shuffle"  # a weighted draw repeats samples: a killer would be in several batches
    batch_size = rng.randint(1, 5) if dataset not in ("killer_always",) else rng.randint(2, 5)
    workers = rng.randint(0, 3)
    if dataset in ("killer_once", "killer_always"):
        workers = max(workers, 1)
    policy = rng.choice(["raise", "skip", "replace"]) if dataset == "images" else "skip"
    if dataset == "killer_once":
        policy = rng.choice(["skip", "replace"])
    persistent = workers > 0 and rng.random() < 1.0
    loop = rng.choice(["plain", "plain", "set_epoch", "cut"])
    # in_order=False: batches come as their workers finish; a cut epoch would keep whichever came first.
    in_order = dataset not in MAP_STYLE or workers < 2 or loop == "cut" or rng.random() < 0.7
    epochs = rng.randint(2, 3)
    batches = -(-size // batch_size)
    cut = rng.randint(1, max(1, batches - 1))
    per_epoch = cut if loop == "cut" else batches - 1
    kill, kill_how = None, "idle"
    if workers > 0 and dataset in RESTARTS and policy != "raise" and rng.random() < 0.3:
        kill = (rng.randrange(epochs), rng.randint(0, max(0, per_epoch - 1)))
    # Killed writing, drawn from a stream of its own (the other axes keep their draws). A worker blocks writing
    # only where a result stays unread: after the loop's batch the prefetch thread holds 3 more, torch has sent
    # up to workers x prefetch_factor (3 at most) tasks past those, and the task it sends after them is never read.
    share = -(-size // 2) if order == "distributed" else size
    room = min(per_epoch - 1, share // batch_size - 5 - 3 * workers)
    apart = random.Random(f"kill writing {seed}")
    if dataset in ("killer_once", "killer_always") and room >= 0 and apart.random() < 0.7:
        kill, kill_how = (apart.randrange(epochs), apart.randint(0, room)), "writing"
    resume = None
    if rng.random() < 0.6 and not (loop == "cut" and cut < 2):
        # inside the epoch: a state at the last batch of a cut epoch resumes into the next (Lightning's case)
        last = cut - 2 if loop == "cut" else per_epoch - 1
        resume = (rng.randrange(epochs), rng.randint(0, max(0, last)))
    resume_batch_size, resume_workers = batch_size, workers
    drop_last = rng.random() < 0.3 and order not in ("tuples", "arrays")
    if resume is not None and map_style and order not in UNRESUMABLE and loop != "cut" and in_order:
        # another batch_size with drop_last drops other samples in the epochs after: not the same run
        if rng.random() < 0.5 and not drop_last:
            resume_batch_size = rng.randint(2, 5) if dataset == "killer_always" else rng.randint(1, 5)
        if rng.random() < 0.7 and dataset not in ("killer_once", "killer_always"):
            resume_workers = rng.randint(0, 3)
    ranks = resume_ranks = 1
    if resume is not None and dataset == "map" and loop != "cut" and rng.random() < 0.7:
        # Ranks: fastloader's own split (re-split at another world size) or torch's (the same world size only).
        order, in_order, drop_last = rng.choice(["seed", "distributed"]), True, False
        ranks = rng.randint(1, 3)
        resume_ranks = rng.randint(1, 3) if rng.random() < 0.6 else ranks
        resume_batch_size = batch_size
    # Drawn last: the axes above draw what they drew before this one existed.
    killers = dataset in ("killer_once", "killer_always") or kill is not None
    worker_method = _worker_method(rng, workers, killers)
    resume_worker_method = _worker_method(rng, resume_workers, killers)
    # Cycling with the seed, as the dataset does: the fixed seeds see each pair. Skipped from a batch of one,
    # the link would leave no batch there: not the reference's count of batches.
    turn = seed // len(DATASETS)
    confine = dataset == "images" and turn % 2 == 1
    outside_link = dataset == "images" and turn % 4 >= 2 and (policy != "skip" or batch_size > 1)
    # A generator of its own: the axes above are those each seed drew before this axis existed.
    if dataset in ("map", "images") and workers > 0 and ranks == 1 and random.Random(f"ray {seed}").random() < 0.5:
        worker_method = "ray"
        resume_worker_method = "ray" if resume_workers > 0 else "process"
    return Case(
        seed=seed,
        dataset=dataset,
        size=size,
        order=order,
        batch_size=batch_size,
        drop_last=drop_last,
        workers=workers,
        persistent=persistent,
        in_order=in_order,
        prefetch=rng.choice([None, 1, 3]) if workers > 0 else None,
        policy=policy,
        cache=dataset == "images" and rng.random() < 0.4,
        exact=dataset == "images" and rng.random() < 0.5,
        loop=loop,
        cut=cut,
        epochs=epochs,
        kill=kill,
        kill_how=kill_how,
        resume=resume,
        resume_batch_size=resume_batch_size,
        resume_workers=resume_workers,
        ranks=ranks,
        resume_ranks=resume_ranks,
        worker_method=worker_method,
        resume_worker_method=resume_worker_method,
        confine=confine,
        outside_link=outside_link,
    )
