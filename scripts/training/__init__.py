"""What train_target.py and train_drafter.py share: the corpus and saving (common), the drafter's losses (distill)."""
