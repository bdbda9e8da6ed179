"""Training recipes, one file per algorithm: `python -m recipes.<name> --help`."""
