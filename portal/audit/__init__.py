"""The audit log: who did what to what, and why. Every layer writes it, so it imports nothing of the
project."""
