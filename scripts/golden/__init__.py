"""Golden fixture builder for kestrel's model tests (see scripts/make_golden.py)."""
