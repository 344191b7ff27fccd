"""The rules in plain Python, the reference both engines are tested against: the guards,
the row fold, the cell rules."""
