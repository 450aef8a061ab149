"""Service-curve calibration: measurement tables (measured with PyTorch or imported from Vidur's GPU
operator profiles), the least-squares fit of a profile on them, and the held-out error of that fit.

measurements.py  the measurement CSV (one row per batch composition, its features and time)
measure.py       times real forward passes of a decoder-only transformer (optional torch extra)
vidur.py         builds iteration times from Vidur's per-operator profiles
fit.py           least squares on a training split, held-out error, the profile, the residual plot
coverage.py      the measured range of a profile against a policy's limits (extrapolation notes)
"""
