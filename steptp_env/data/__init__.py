"""Recorded trajectories and datasets; for now, reading the Step-TP reference corpus."""
