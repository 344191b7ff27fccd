"""Publish: the commits of a run, what it publishes, and the store's upkeep."""
