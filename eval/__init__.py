"""Evaluation tasks and the acceptance evaluation (installed as distill.eval)."""
