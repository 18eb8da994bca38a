"""Plots and tables a person reads after a run, made from the CSVs in its results directory."""
