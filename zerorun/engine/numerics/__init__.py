"""Numerics: the precision policy, the loss scaler, the global gradient norm."""
