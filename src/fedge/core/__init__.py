"""Core pieces every method shares: errors, randomness, messages, transforms."""
