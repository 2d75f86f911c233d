"""Weight operators: rejection-sampling SFT of the solver (the WHALE weight phase), the
trainable checkpoint of an embedded model, and serving trained LoRA adapters fast."""
