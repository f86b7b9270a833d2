"""What the config builds for training: the optimizer, the learning-rate schedules, the data loader."""
