"""Implementations that run cuDNN's kernels through the cuDNN frontend's graph API
(``nvidia-cudnn-frontend``, imported on first use: without it these implementations drop out).
"""
