"""The pipelines the doctor and the bench measure: torchvision's ImageNet recipes, as fastloader runs them
and as torchvision does; and how both report the bad samples they replaced on the way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PIPELINES = ("train", "eval")
_EXAMPLES = 5  # bad samples named in a result
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, as torchvision's examples


def _check(name: str) -> None:
    if name not in PIPELINES:
        raise ValueError(f"pipeline must be one of {', '.join(PIPELINES)}, got {name!r}")


def fastloader_transform(name: str) -> Any:
    """train: RandomResizedCrop(224) + flip; eval: Resize(256) + CenterCrop(224); fused with decoding."""
    from fastloader import transforms as T

    _check(name)
    if name == "train":
        return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
    return T.Compose([T.Resize(256), T.CenterCrop(224)])


def torchvision_geometry(name: str) -> list[Any]:
    """The same steps as torchvision's transforms (on PIL images)."""
    from torchvision import transforms as tv

    _check(name)
    if name == "train":
        return [tv.RandomResizedCrop(224), tv.RandomHorizontalFlip()]
    return [tv.Resize(256), tv.CenterCrop(224)]


def bad_samples_found(policy: Any) -> dict[str, Any]:
    """``bad_samples`` (how many a dataset's ``ErrorPolicy`` replaced) and ``bad_examples`` (the first few)."""
    bad = policy.bad_samples() if policy is not None else []
    return {"bad_samples": len(bad), "bad_examples": [f"{sample.key}: {sample.reason}" for sample in bad[:_EXAMPLES]]}


def bad_sample_lines(result: Mapping[str, Any]) -> list[str]:
    """What ``bench`` and ``doctor`` print about the bad samples they replaced (nothing when none)."""
    count = result.get("bad_samples") or 0
    if not count:
        return []
    examples = list(result.get("bad_examples") or ())
    lines = [f"bad samples: {count} (each replaced by the next good one, as on_error='replace' does)"]
    lines += [f"  {example}" for example in examples]
    if count > len(examples):
        lines.append("  ... list them all with `fastloader scan`")
    return lines
