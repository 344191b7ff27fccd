"""Resolve: the copies read, the row and cell engines, the ledger, the state written."""
