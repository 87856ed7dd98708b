"""The model to export: logistic regression's mean negative log-likelihood."""
import numpy as np


def loss(w, b, x, y):
    """Mean binary cross-entropy of sigmoid(x @ w + b) against labels y in {0, 1}."""
    z = x @ w + b
    # log(1 + exp(z)) - y z, written stably: max(z, 0) + log(1 + exp(-|z|))
    return np.mean(np.maximum(z, 0.0) + np.log1p(np.exp(-np.abs(z))) - y * z)
