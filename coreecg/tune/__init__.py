"""Sweeps and ablations on Ray Tune: search spaces, the trial trainable, results and plots."""
