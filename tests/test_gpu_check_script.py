"""benchmarks/gpu_check.sh, the prepared GPU run, works before it meets a GPU: its CPU smoke mode
(``GLC_SMALL=1 GLC_DEVICE=cpu``) runs a few cheap steps through the driver, each in its own process,
and every step writes one well-formed JSON line with what it found."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers import run_child

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["sample", "env", "decode_equality", "rng", "copy_race"]


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash, timeout")
def test_smoke_run_of_cheap_steps_writes_one_json_line_per_step(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        OUT=str(out),
        SAMPLE=str(tmp_path / "sample"),
        GLC_SMALL="1",
        GLC_DEVICE="cpu",
        GLC_N_SAMPLE="24",
        GLC_WHEELS="0",  # never unpack a GPU machine's wheels (another Python's) into this run
        GLC_STEPS=" ".join(STEPS),
    )
    done = run_child(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert (out / "log.txt").exists()

    driver = [line for line in lines if line["step"] == "driver"]
    assert [(line["name"], line["rc"]) for line in driver] == [(step, 0) for step in STEPS]
    results = {line["step"]: line for line in lines if line["step"] != "driver"}
    assert list(results) == STEPS
    for line in results.values():
        assert "crashed" not in line, line.get("crashed")
        assert isinstance(line["s"], float)

    assert results["sample"]["images"] == 24
    assert results["env"]["device"] == "cpu" and results["env"]["small"] is True
    assert set(results["env"]["modules"]) == {"lmdb", "crc32c", "psutil", "tqdm", "pytest"}
    # the JPEG decoder decode_on="cuda" runs, recorded, and the decode checked with each one installed
    codec = importlib.util.find_spec("torchcodec") is not None
    chosen = "torchcodec" if codec else "torchvision"
    assert results["env"]["jpeg_decoder"].startswith(f"{chosen} ")
    assert set(results["env"]["jpeg_decoders"]) == {"torchcodec", "torchvision"}
    equality = results["decode_equality"]
    assert equality["decoders"] == (["torchcodec", "torchvision"] if codec else ["torchvision"])
    for pipeline in ("eval_bilinear", "train_bicubic"):
        assert equality[pipeline]["decoder"].startswith(f"{chosen} ")
        assert equality[pipeline]["vs_cpu_path"]["max"] < 3.0  # levels, per image
        if codec:
            assert equality[pipeline]["torchcodec_vs_torchvision"]["max"] <= 1.0
    rng = results["rng"]
    assert rng["flips_reproducible"] and rng["flips_differ_for_another_seed"] and rng["flips_differ_between_epochs"]
    assert rng["loop_dropout_masks_reproducible"] and rng["cuda_rng_untouched_by_loader"] is None
    assert 0.2 < rng["flipped_share"] < 0.8
    copies = results["copy_race"]
    variants = {"default_stream", "other_stream_read_at_once", "other_stream_free_while_queued"}
    variants.add("pageable_default_stream")
    assert variants <= set(copies)
    assert all(copies[v]["batches"] == 2 and copies[v]["corrupted_samples"] == 0 for v in variants)


def test_an_unknown_step_is_refused_with_the_list_of_steps() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLC_DEVICE="cpu")
    done = run_child(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "no_such_step"],
        env=env,
    )  # fmt: skip
    assert done.returncode == 2
    assert "decode_race" in done.stderr and "scaling" in done.stderr
