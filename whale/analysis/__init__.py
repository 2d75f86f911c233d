"""Analysis of runs: curves of eval accuracy against training rollouts, capability metrics."""
