"""Optimisation: the optimisers and learning-rate scaling (`optimizers.py`; LARS and LAMB written here),
bitsandbytes' 8-bit AdamW (`adamw8bit.py`), and the warm-up + cosine schedule (`schedule.py`).
May import: torch, bitsandbytes (only when asked)."""
