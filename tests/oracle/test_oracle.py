"""The differential fuzz oracle: loader configurations drawn from seeds (tests/oracle/cases.py), every
delivered sample checked epoch by epoch against a reference.

The reference is torch's ``DataLoader`` over the same arguments, made after the same ``torch.manual_seed``,
where it is exact (every case but these); otherwise a small specification of the uninterrupted run:

* ``seed=`` (fastloader's own order): DataLoaderX in its plainest form (no workers) over the same order; each
  sample's random draws are then a function of (seed, epoch, sample index) (``fastloader.sample_seeds``), so
  every sample is checked whole (its pixels, its draws) in every case below, a resume at another
  ``batch_size`` or ``num_workers`` included;
* a sample that kills its worker once: torch's run in which nothing dies (the restarted worker makes the batch
  again, with the dead worker's random state); one that kills every time (``on_error="skip"``): torch's run
  without that sample; a worker SIGKILLed while idle, or while blocked writing its result (a result not
  delivered whole is made again): torch's run;
* the decoded cache: torch's run over the same dataset without a cache;
* a symbolic link in the image folder to an image outside its root (alone in its class): without ``confine``
  torch's run, which reads it as torchvision does; under ``confine=True`` with ``on_error="skip"`` torch's
  run without that sample, with ``"replace"`` with the sample after it (the folder's first) in its place
  (labels only: the refused sample makes no random draws), with ``"raise"`` an ``OutsideRoot`` naming it;
* ``in_order=False``: the same samples each epoch, in any order;
* ``worker_method="thread"`` and ``"subprocess"`` (thread workers in one child process): torch's run (process
  workers), sample for sample: a thread draws from its own generators (``get_worker_info().rng``, which
  fastloader's random transforms draw from too), seeded as a worker process's globals;
* ``worker_method="ray"`` (actors inside this process, tests/oracle/fake_ray.py, answering in any order and dying
  now and then): torch's run, keys only (without `seed=` the actors seed the draws per batch, not per worker);
* a resume (the state at a random batch of a random epoch, through JSON, loaded in a fresh loader made after
  another global seed, with another ``batch_size`` or ``num_workers`` where that is exact): the uninterrupted
  run's rest, sample for sample (with ``num_workers=0`` the dataset draws from the training process's own
  generators, which a checkpoint of the training loop restores, not the loader: keys only there); a resume
  DataLoaderX refuses (a user sampler that records nothing; ``drop_last`` at another batch size) must be a
  ValueError saying why;
* ranks (``ranks`` simulated ranks, each its own loader, every rank's state taken at the same batch and loaded
  on ``resume_ranks`` ranks): over the ranks, every sample of the epoch's rest delivered (repeated only as the
  splits' padding repeats it), and per rank the epochs after it as the uninterrupted run on ``resume_ranks``
  ranks gives them; the same world size gives each rank its own uninterrupted epoch. torch's
  DistributedSampler at another world size is refused with a ValueError (docs/guide/resume.md). Keys only.

``make test`` runs the fixed seeds below (about 3 minutes on 2 cores); ``make fuzz N=...`` draws more
(``FASTLOADER_FUZZ_SEEDS``: a count, or ``start:count``). A failure names the seed and the whole case: run one
with ``FASTLOADER_FUZZ_SEEDS=SEED:1``.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fastloader.errors import OutsideRoot
from fastloader.loader.workers import ray_workers
from tests.oracle.cases import UNRESUMABLE, Case, draw
from tests.oracle.fake_ray import FakeRay
from tests.oracle.runs import (
    KILLER_AT,
    LINK_LABEL,
    OTHER_SEED,
    SEED,
    Record,
    World,
    epochs,
    interrupted,
    kill_a_worker,
    make_loader,
    rank_loader,
    seed_all,
)


def _seeds() -> list[int]:
    spec = os.environ.get("FASTLOADER_FUZZ_SEEDS")
    if not spec:
        return list(range(40))
    start, _, count = spec.rpartition(":")
    return list(range(int(start or 1000), int(start or 1000) + int(count)))


def reference(case: Case, world: World) -> list[list[Record]]:
    """What an uninterrupted run of ``case`` delivers, per epoch (see the module docstring)."""
    seed_all(SEED)
    if case.order == "seed":  # fastloader's own order: its plainest loader, without workers
        plain = Case(**{**case.__dict__, "in_order": True, "prefetch": None, "kill": None})
        loader = make_loader(plain, world.dataset(plain=True, run="reference"), workers=0)
    else:
        loader = make_loader(case, world.dataset(plain=True, run="reference"), torch_loader=True)
    expected = epochs(case, loader)
    if case.dataset == "killer_always":
        expected = [[record for record in epoch if record[0] != KILLER_AT] for epoch in expected]
    if _link_refused(case) and case.policy == "skip":
        expected = [[record for record in epoch if record[0] != LINK_LABEL] for epoch in expected]
    if _link_refused(case) and case.policy == "replace":  # the next good sample: index 0, of class 0
        expected = [[(0, None) if key == LINK_LABEL else (key, d) for key, d in epoch] for epoch in expected]
    return expected


def _link_refused(case: Case) -> bool:
    """Whether the run refuses a sample the reference reads: the link out of the root, under ``confine``."""
    return case.confine and case.outside_link


def _timed_draws(case: Case) -> bool:
    """Whether the samples' random draws after a cut epoch depend on timing: persistent workers (or, with
    ``num_workers=0``, the training process) go on from the generators they had, and how many samples they
    made past the cut depends on how far the prefetch thread ran ahead (docs/differences.md). Keys do not."""
    return case.loop == "cut" and (case.persistent or case.workers == 0)


def _draws_differ(case: Case) -> bool:
    """Whether the reference cannot know the samples' draws: a sample that kills its worker every time is
    tried alone and left out (its draws, and the probes', are not made in the reference's run); with
    ``in_order=False`` a batch goes to the least busy worker (torch's rule too), whose generators it draws from;
    Ray actors seed them per batch, not per worker."""
    return case.dataset == "killer_always" or not case.in_order or case.worker_method == "ray"


def _per_sample_draws(case: Case) -> bool:
    """Whether each sample's draws are a function of (seed, epoch, sample index), whoever makes it: ``seed=``."""
    return case.order == "seed"


def _same(case: Case, got: list[Record], expected: list[Record], keys_only: bool = False) -> bool:
    # With per-sample draws each sample is the reference's whole, whatever the workers, the timing, the resume.
    if not _per_sample_draws(case) and (keys_only or _timed_draws(case) or _draws_differ(case)):
        got, expected = [(key, None) for key, _ in got], [(key, None) for key, _ in expected]
    if case.in_order or case.workers < 2:
        return got == expected
    return Counter(got) == Counter(expected)


def check_uninterrupted(case: Case, world: World) -> list[list[Record]] | None:
    """The uninterrupted run, checked against the reference; None when it must raise (and did)."""
    seed_all(SEED)
    loader = make_loader(case, world.dataset(run="uninterrupted"))
    if _link_refused(case) and case.policy == "raise":
        with pytest.raises(OutsideRoot, match=rf"class_{LINK_LABEL}/link\.jpg.*points outside the root"):
            epochs(case, loader)
        return None
    expected = reference(case, world)
    seed_all(SEED)
    loader = make_loader(case, world.dataset(run="uninterrupted"))
    got = epochs(case, loader, hook=kill_a_worker(case) if case.kill else None)
    for number, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        assert _same(case, ours, theirs, keys_only=_link_refused(case)), f"epoch {number}: {ours} != {theirs}"
    return got


def check_resume(case: Case, world: World, uninterrupted: list[list[Record]]) -> None:
    assert case.resume is not None
    seed_all(SEED)
    loader = make_loader(case, world.dataset(run="interrupted"))
    seen, state, ended = interrupted(case, loader)
    del loader
    seed_all(OTHER_SEED)  # a new process, seeded otherwise
    resumed_loader = make_loader(
        case,
        world.dataset(run="resumed"),
        batch_size=case.resume_batch_size,
        workers=case.resume_workers,
        worker_method=case.resume_worker_method,
    )
    try:
        resumed_loader.load_state_dict(state)
    except ValueError as error:
        message = str(error)
        refused = case.order in UNRESUMABLE or (case.drop_last and case.resume_batch_size != case.batch_size)
        assert refused, f"an exact resume was refused: {message}"
        return
    assert case.order not in UNRESUMABLE or state["batches_yielded"] == 0, "a user sampler's position was guessed"
    epoch, batch = case.resume
    # Another batch_size or num_workers gives the samples to other workers (other generators): keys only.
    changed = case.resume_workers != case.workers or case.resume_batch_size != case.batch_size
    keys_only = case.workers == 0 or case.resume_workers == 0 or changed
    assert _same(case, seen[epoch], uninterrupted[epoch], keys_only) or not ended, f"epoch {epoch} before the state"
    if ended:  # the state names the next epoch, at its first batch
        epoch, received = epoch + 1, 0
    else:
        received = batch + 1
    rest = epochs(case, resumed_loader, first=epoch, received=received)
    if rest and not ended:
        # The loaded epoch: what was seen before the state, then the rest, is the uninterrupted epoch.
        got = seen[-1] + rest[0]
        assert _same(case, got, uninterrupted[epoch], keys_only), f"epoch {epoch} after the resume: {got}"
        rest, epoch = rest[1:], epoch + 1
    for number, (ours, theirs) in enumerate(zip(rest, uninterrupted[epoch:], strict=True)):
        assert _same(case, ours, theirs, keys_only), f"epoch {epoch + number} after the resume: {ours}"


def _keys(records: list[Record]) -> list[Any]:
    return [key for key, _ in records]


def check_ranks(case: Case, world: World) -> None:
    """A resume from ``case.ranks`` simulated ranks onto ``case.resume_ranks`` (see the module docstring)."""
    assert case.resume is not None
    before, after = case.ranks, case.resume_ranks

    def loaders(ranks: int, workers: int, run: str, method: str) -> list[Any]:
        return [
            rank_loader(case, world.dataset(run=f"{run}{rank}"), ranks, rank, workers, method) for rank in range(ranks)
        ]

    seed_all(SEED)
    reference = [
        epochs(case, loader) for loader in loaders(after, case.resume_workers, "reference", case.resume_worker_method)
    ]
    seed_all(SEED)
    runs = [interrupted(case, loader) for loader in loaders(before, case.workers, "interrupted", case.worker_method)]
    ended = runs[0][2]
    assert all(run[2] == ended for run in runs), "the ranks did not stop in lockstep"
    seed_all(OTHER_SEED)
    resumed = loaders(after, case.resume_workers, "resumed", case.resume_worker_method)
    try:
        for rank, loader in enumerate(resumed):
            loader.load_state_dict(runs[rank % before][1])
    except ValueError as error:
        assert case.order == "distributed" and before != after, f"an exact resume was refused: {error}"
        return
    assert case.order == "seed" or before == after, "torch's DistributedSampler was re-split"
    epoch = case.resume[0] + 1 if ended else case.resume[0]
    received = 0 if ended else case.resume[1] + 1
    rests = [epochs(case, loader, first=epoch, received=received) for loader in resumed]
    if not ended:
        if before == after:
            for rank in range(after):
                got = _keys(runs[rank][0][-1]) + _keys(rests[rank][0])
                assert got == _keys(reference[rank][epoch]), f"rank {rank}, epoch {epoch} after the resume: {got}"
        delivered = Counter(key for run in runs for key in _keys(run[0][-1]))
        delivered.update(key for rest in rests for key in _keys(rest[0]))
        # the old layout's padding, and the re-split rest's (at most one index per new rank)
        padding = -(-case.size // before) * before - case.size + after - 1
        missing = set(range(case.size)) - set(delivered)
        assert not missing, f"epoch {epoch}: samples {sorted(missing)} never delivered over the ranks"
        extra = sum(delivered.values()) - case.size
        assert extra <= padding, f"epoch {epoch}: {extra} samples delivered twice (padding {padding}): {delivered}"
        rests, epoch = [rest[1:] for rest in rests], epoch + 1
    for rank in range(after):
        for number, (ours, theirs) in enumerate(zip(rests[rank], reference[rank][epoch:], strict=True)):
            assert _keys(ours) == _keys(theirs), f"rank {rank}, epoch {epoch + number} after the resume: {ours}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", _seeds())
def test_drawn_configuration_delivers_the_reference(seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case = draw(seed)
    world = World(case, tmp_path)
    if case.worker_method == "ray":
        fake = FakeRay(seed, deaths=2)
        monkeypatch.setattr(ray_workers, "import_ray", lambda: fake)
    try:
        if case.ranks > 1 or case.resume_ranks > 1:
            check_ranks(case, world)
            return
        uninterrupted = check_uninterrupted(case, world)
        if case.resume is not None and uninterrupted is not None:
            check_resume(case, world, uninterrupted)
    except AssertionError as error:
        raise AssertionError(f"seed {seed}: {case.describe()}\n{error}") from None


def test_the_draws_cover_every_axis() -> None:
    """The fixed seeds draw every value of each axis (a lever the draw never takes is not checked)."""
    cases = [draw(seed) for seed in _seeds()]
    seen: dict[str, set[Any]] = {}
    for case in cases:
        for key, value in case.__dict__.items():
            seen.setdefault(key, set()).add(value)
    assert seen["dataset"] >= {"map", "stream", "stateful_stream", "images", "killer_once", "killer_always"}
    assert seen["order"] >= {"sequential", "shuffle", "generator", "seed", "weighted", "distributed"}
    assert seen["order"] >= {"numpy", "tuples", "arrays"}
    assert seen["workers"] == {0, 1, 2, 3}
    assert seen["worker_method"] == seen["resume_worker_method"] == {"process", "thread", "subprocess", "ray"}
    assert seen["persistent"] == {False, True} and seen["in_order"] == {False, True}
    assert seen["drop_last"] == {False, True} and seen["cache"] == {False, True} and seen["exact"] == {False, True}
    assert seen["policy"] >= {"raise", "skip", "replace"}
    assert seen["loop"] == {"plain", "set_epoch", "cut"}
    assert any(case.kill for case in cases) and any(case.resume for case in cases)
    assert {case.kill_how for case in cases if case.kill} == {"idle", "writing"}
    assert any(case.resume and case.resume_batch_size != case.batch_size for case in cases)
    assert any(case.resume and case.resume_workers != case.workers for case in cases)
    assert any(case.resume and case.resume[0] > 0 for case in cases)
    assert any(case.ranks != case.resume_ranks for case in cases)
    images = [case for case in cases if case.dataset == "images"]  # make fuzz draws every policy with the link
    assert {(case.confine, case.outside_link) for case in images} == {
        (c, o) for c in (False, True) for o in (False, True)
    }
    assert any(case.worker_method == "ray" and case.resume for case in cases)
