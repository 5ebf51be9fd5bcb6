"""Control loops in the cluster simulator: policy adapters, baselines and their evaluation."""
