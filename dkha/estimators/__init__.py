"""The public Python API: the estimators, their one parameter table, tuning."""
