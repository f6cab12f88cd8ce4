"""A run's directory and its record: one run, one directory, one record."""
