"""Evaluation of the control loops in the cluster simulator (issue 6).

See docs/experiments/control.md.
"""
