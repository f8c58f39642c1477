"""Diagnostics of a fastloader setup, run on the user's own data."""
