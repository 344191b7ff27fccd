"""Stores (S3, a folder), the run's work folder and its outputs, the lease, the Delta layer
and the runs table."""
