"""Compute backends for Sprig's engine (NumPy reference, MLX, CUDA).

This package imports neither Qt nor the engine.
"""
