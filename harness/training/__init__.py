"""Training runs the checks compare: starting a training script at 1 or more ranks (training.py), the cases
table (training_cases.py), stored CPU reference curves (references.py) and the loss-by-loss comparison within
the tolerance table (loss_comparison.py)."""
