"""Independent NumPy implementations of SPEC.md's formulas, for the tests."""

import numpy as np


def block_softmax(z, num_blocks, block_size):
    blocks = z.reshape(len(z), num_blocks, block_size).astype(np.float64)
    blocks = np.exp(blocks - blocks.max(-1, keepdims=True))
    return (blocks / blocks.sum(-1, keepdims=True)).reshape(z.shape)


def entropy_bits(p):
    """-Σ p log2 p over the last axis, 0·log 0 = 0."""
    p = np.asarray(p, np.float64)
    logs = np.log2(np.where(p > 0, p, 1.0))
    return -(p * logs).sum(-1)


def block_entropy(probs, num_blocks, block_size):
    return entropy_bits(probs.reshape(len(probs), num_blocks, block_size)).sum(-1)


def batch_block_entropy(probs, num_blocks, block_size):
    mean = probs.reshape(len(probs), num_blocks, block_size).astype(np.float64).mean(0)
    return entropy_bits(mean).sum()


def scaled_cross_entropy(labels, probs):
    picked = probs[np.arange(len(labels)), labels].astype(np.float64)
    return -np.log2(picked) / np.log2(probs.shape[-1])


def subic_loss_terms(probs, num_blocks, block_size, gamma, mu):
    """(γ-weighted mean entropy, μ-weighted negative batch entropy), SPEC.md."""
    bits = num_blocks * np.log2(block_size)
    mean_term = gamma / bits * block_entropy(probs, num_blocks, block_size).mean()
    batch_term = -mu / bits * batch_block_entropy(probs, num_blocks, block_size)
    return mean_term, batch_term


def bilinear_reference(image, out_h, out_w):
    """Half-pixel-centre bilinear resizing of one `(H, W, C)` image."""
    image = image.astype(np.float64)

    def axis(out, size):
        source = np.clip((np.arange(out) + 0.5) * size / out - 0.5, 0, size - 1)
        low = np.floor(source).astype(int)
        return low, np.minimum(low + 1, size - 1), source - low

    r0, r1, fr = axis(out_h, image.shape[0])
    c0, c1, fc = axis(out_w, image.shape[1])
    rows = image[r0] * (1 - fr)[:, None, None] + image[r1] * fr[:, None, None]
    return rows[:, c0] * (1 - fc)[None, :, None] + rows[:, c1] * fc[None, :, None]
