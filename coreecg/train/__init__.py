"""Training: the reusable step, optimiser/schedules, checkpoints and the plain-PyTorch loop."""
