"""Validate: the Great Expectations suites, the gate, the Data Docs."""
