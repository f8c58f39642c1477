"""What is active: the report behind ``fastloader info``.

Users at this scale lose days to a silently wrong environment (plain Pillow instead of
Pillow-SIMD, libjpeg instead of libjpeg-turbo, a CPU affinity of one core inside a container),
so this names each piece explicitly.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata

from fastloader.gil import gil_report


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def pil_flavor() -> tuple[str, str]:
    """``("Pillow-SIMD" | "Pillow", version)`` of the ``PIL`` that imports."""
    import PIL

    simd = _dist_version("Pillow-SIMD") or _dist_version("pillow-simd")
    if simd is not None and simd == PIL.__version__.replace("-", "."):
        return "Pillow-SIMD", PIL.__version__
    if ".post" in PIL.__version__:  # Pillow-SIMD's own version scheme, however it was installed
        return "Pillow-SIMD", PIL.__version__
    return "Pillow", PIL.__version__


def libjpeg_version() -> str:
    from PIL import features

    turbo = features.check_feature("libjpeg_turbo")
    version = features.version_feature("libjpeg_turbo") if turbo else features.version("jpg")
    return f"{'libjpeg-turbo' if turbo else 'libjpeg'} {version or 'unknown'}"


def cpu_report() -> dict[str, str]:
    from fastloader import world

    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    report = {"cpu count": str(os.cpu_count())}
    if affinity is not None:
        report["cpu affinity"] = f"{len(affinity)} cores {_ranges(affinity)}"
    quota = world.cgroup_cpu_quota()
    if quota is not None:
        report["cgroup cpu quota"] = f"{quota:g} cores"
    report["local ranks"] = str(world.local_world_size())
    report["workers per rank"] = f"{world.suggested_num_workers()} suggested (usable cores / local ranks)"
    return report


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    spans: list[list[int]] = []
    for value in values:
        if spans and value == spans[-1][1] + 1:
            spans[-1][1] = value
        else:
            spans.append([value, value])
    return ",".join(f"{first}-{last}" if first != last else str(first) for first, last in spans)


def torch_report() -> dict[str, str]:
    import torch

    report: dict[str, str] = {"torch": str(torch.__version__)}
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        report["cuda"] = f"{torch.version.cuda} ({torch.cuda.device_count()} device(s): {names})"
    else:
        built = torch.version.cuda
        report["cuda"] = f"not available (torch built with CUDA {built})" if built else "not available (CPU build)"
    for name in ("torchvision", "torchcodec"):  # torchcodec: decode_on="cuda"'s JPEG decoder when installed
        installed = _dist_version(name)
        if installed is not None:
            report[name] = installed
    return report


def extension_report() -> str:
    """Whether fastloader's JPEG extension is built (region decode, resize into the batch) and its resize's SIMD."""
    from fastloader.image import jpeg_ext

    if not jpeg_ext.AVAILABLE:
        return "not built (JPEGs decode with PIL: no libjpeg-turbo headers at install)"
    return f"built, resize with {'AVX2' if jpeg_ext.RESIZE_SIMD else 'plain C (no AVX2)'}"


def gpu_jpeg_decoder() -> tuple[str, str | None]:
    """The report's line on ``decode_on="cuda"``'s JPEG decoder, and a warning when ``$FASTLOADER_JPEG_DECODER``
    names none of them (GPU decode then refuses to start: said here, before a run does)."""
    from fastloader.image.gpu_jpeg import ENV, NAMES

    name = os.environ.get(ENV) or None
    if name is None:
        return f"the first of {', '.join(NAMES)} that works (${ENV} unset)", None
    if name in NAMES:
        return f"{name} (${ENV})", None
    wrong = f"${ENV}={name!r} names no JPEG decoder: it must be one of {', '.join(NAMES)}"
    return f"{wrong} (decode_on='cuda' refuses it)", f"{wrong}; decode_on='cuda' refuses to start with it"


def collect() -> dict[str, str]:
    """The whole report as ordered ``name -> value`` pairs."""
    import fastloader

    gil = gil_report()  # first: the imports below would warn before it listens
    flavor, version = pil_flavor()
    report = {"fastloader": fastloader.__version__, "python": platform.python_version(), "GIL": gil}
    report.update(torch_report())
    report["PIL"] = f"{flavor} {version}"
    report["jpeg"] = libjpeg_version()
    report["jpeg extension"] = extension_report()
    report["gpu jpeg decoder"] = gpu_jpeg_decoder()[0]
    for name in ("lmdb", "numpy"):
        report[name] = _dist_version(name) or "not installed"
    report.update(cpu_report())
    return report


def format_report(report: dict[str, str]) -> str:
    width = max(len(name) for name in report)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in report.items())
