"""The search: space files, the Optuna study, its results."""
