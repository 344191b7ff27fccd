"""What every part reads: errors, the policy tables, the config model, the store's keys,
the run report's types. No Spark, no store."""
