"""The JSON Schema of ``fastloader doctor --json`` (draft 2020-12): what machines reading it may rely on."""

from __future__ import annotations

from typing import Any

from fastloader.timing import STAGES

_NUMBER = {"type": ["number", "null"]}
_COUNT = {"type": "integer", "minimum": 0}
_STAGE = {
    "type": "object",
    "required": ["total_s", "per_image_ms", "per_batch_ms", "where"],
    "properties": {
        "total_s": {"type": "number", "minimum": 0},
        "per_image_ms": _NUMBER,
        "per_batch_ms": {
            "type": ["object", "null"],
            "required": ["p50", "p90", "p99"],
            "properties": {name: {"type": "number", "minimum": 0} for name in ("p50", "p90", "p99")},
        },
        "where": {"enum": ["workers", "main process", "training loop"]},
    },
}
_READS = {
    "type": "object",
    "required": ["mb_per_s", "files_per_s", "files", "bytes", "seconds"],
    "properties": {
        "mb_per_s": _NUMBER,
        "files_per_s": _NUMBER,
        "files": _COUNT,
        "bytes": _COUNT,
        "unreadable": _COUNT,  # items passed over: they could not be read
    },
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "fastloader doctor result",
    "type": "object",
    "required": [
        "fastloader_version",
        "created",
        "dataset",
        "config",
        "environment",
        "traps",
        "storage",
        "stages",
        "throughput",
        "timeline",
        "cpu",
        "gpu",
        "verdict",
    ],
    "properties": {
        "fastloader_version": {"type": "string"},
        "created": {"type": "string"},
        "dataset": {
            "type": "object",
            "required": ["path", "format", "images"],
            "properties": {"path": {"type": "string"}, "format": {"type": "string"}, "images": _COUNT},
        },
        "config": {
            "type": "object",
            "required": ["batch_size", "num_workers", "transform", "decode_on", "step_ms", "pin_memory", "device"],
            "properties": {"batch_size": {"type": "integer", "minimum": 1}, "num_workers": _COUNT},
        },
        "environment": {
            "type": "object",
            "required": ["usable_cores", "shm_bytes", "shm_needed_bytes", "open_files_limit", "cuda", "gil"],
            "properties": {"usable_cores": {"type": "integer", "minimum": 1}, "cuda": {"type": "boolean"}},
        },
        "traps": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "message", "fix"],
                "properties": {
                    "name": {"enum": ["shm_too_small", "open_files_limit", "workers_over_cores", "gil_enabled"]}
                },
            },
        },
        "storage": {
            "type": ["object", "null"],
            "required": ["sequential", "random"],
            "properties": {"sequential": _READS, "random": _READS},
        },
        "stages": {
            "type": "object",
            "propertyNames": {"enum": list(STAGES)},
            "additionalProperties": _STAGE,
        },
        "throughput": {
            "type": "object",
            "required": ["images_per_s", "batches", "images", "seconds", "wait_fraction"],
            "properties": {
                "images_per_s": _NUMBER,
                "batches": _COUNT,
                "images": _COUNT,
                "wait_fraction": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
            },
        },
        "timeline": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["t", "images_per_s", "prefetch_queue", "worker_queue"],
                "properties": {
                    key: {"type": "number"} for key in ("t", "images_per_s", "prefetch_queue", "worker_queue")
                },
            },
        },
        "cpu": {
            "type": "object",
            "required": ["per_core_percent_mean", "timeline", "rss_bytes"],
            "properties": {
                "per_core_percent_mean": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 100}},
                "timeline": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["t", "per_core"],
                        "properties": {"per_core": {"type": "array", "items": {"type": "number"}}},
                    },
                },
                "rss_bytes": _COUNT,
                "busy_before_percent": {"type": ["number", "null"], "minimum": 0, "maximum": 100},
            },
        },
        "gpu": {"type": ["object", "null"]},
        "bad_samples": _COUNT,  # replaced by the next good one (on_error="replace")
        "bad_examples": {"type": "array", "items": {"type": "string"}},  # the first few, "key: reason"
        "verdict": {
            "type": "object",
            "required": ["level", "wait_fraction", "bottleneck", "summary", "advice"],
            "properties": {
                "level": {
                    "enum": [
                        "not input-bound",
                        "moderately input-bound",
                        "highly input-bound",
                        "loader only (no training step)",
                    ]
                },
                "bottleneck": {"type": ["string", "null"]},
                "summary": {"type": "string"},
                "advice": {"type": "array", "items": {"type": "string"}},
            },
        },
    },
}
