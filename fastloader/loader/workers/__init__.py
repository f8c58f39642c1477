"""Where the per-sample work of a DataLoaderX runs besides torch's worker processes (``worker_method``)."""
