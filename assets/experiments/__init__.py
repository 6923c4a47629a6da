"""Experiment files: each defines an `Experiment`; running one as a script materializes it."""
