"""Adapters to training frameworks that would otherwise replace DataLoaderX by a loader of their own.

Each module imports its framework when it is imported itself, never from ``import fastloader``: the
frameworks are optional dependencies. ``fastloader.integrations.accelerate``: Hugging Face accelerate;
``fastloader.integrations.transformers``: Hugging Face Trainer's resume (with accelerate's ``prepare``).
"""

__all__: list[str] = []  # nothing here: import fastloader.integrations.accelerate, which imports accelerate
