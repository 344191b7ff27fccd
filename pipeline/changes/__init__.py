"""What resolved changes derive: the CDC log and its streams, the history, the replay."""
