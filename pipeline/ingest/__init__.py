"""Ingest: manifests, the files fetched and typed, the adapters, what a run starts from."""
