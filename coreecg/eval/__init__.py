"""Evaluation: metrics (scikit-learn), the in-loop representation probe, figures."""
