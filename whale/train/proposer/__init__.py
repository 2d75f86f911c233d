"""Training the proposer: revision contexts, teacher data, SFT, GRPO and evaluation."""
