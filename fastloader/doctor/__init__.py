"""``fastloader doctor``: measure a pipeline on the user's data and name its bottleneck."""
