"""The four losses as plain Python loops over pairs, written from the papers' formulas (float64 in, scalar out).

Slow on purpose: every similarity is its own dot product of unit vectors and every sum is a Python loop, so
these share no code path (no matmul, no logsumexp, no cross_entropy) with the library. They are autograd
traceable, so the tests can differentiate them too.
"""

from __future__ import annotations

import torch


def cosine(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """u.v / (|u| |v|) for two (D,) vectors."""
    return (u * v).sum() / torch.sqrt((u * u).sum() * (v * v).sum())


def infonce(query, positive, negatives, temperature: float, symmetric: bool, queue=None) -> torch.Tensor:
    """-1/N sum_i log(exp(q_i.p_i/t) / (sum_j exp(q_i.p_j/t) + sum_k exp(q_i.n_k/t))), optionally averaged with
    the positive-to-query direction -1/N sum_i log(exp(p_i.q_i/t) / sum_j exp(p_i.q_j/t)); the queue's rows,
    if any, are more n_k of every query."""
    n = len(query)
    candidates = list(positive) + ([] if negatives is None else list(negatives))
    candidates += [] if queue is None else list(queue)
    forward = 0.0
    for i in range(n):
        denominator = sum(torch.exp(cosine(query[i], c) / temperature) for c in candidates)
        forward = forward - torch.log(torch.exp(cosine(query[i], positive[i]) / temperature) / denominator)
    loss = forward / n
    if symmetric:
        backward = 0.0
        for i in range(n):
            denominator = sum(torch.exp(cosine(positive[i], query[j]) / temperature) for j in range(n))
            backward = backward - torch.log(torch.exp(cosine(positive[i], query[i]) / temperature) / denominator)
        loss = (loss + backward / n) / 2
    return loss


def ntxent(z1, z2, temperature: float, queue=None) -> torch.Tensor:
    """SimCLR eq. (1) averaged over all 2N anchors: l(k, k+) = -log(exp(sim_k,k+/t) / sum_{j != k} exp(sim_kj/t)),
    the queue's rows, if any, in every denominator."""
    n = len(z1)
    views = list(z1) + list(z2)
    queued = [] if queue is None else list(queue)
    total = 0.0
    for k in range(2 * n):
        partner = (k + n) % (2 * n)
        denominator = sum(torch.exp(cosine(views[k], views[j]) / temperature) for j in range(2 * n) if j != k)
        denominator = denominator + sum(torch.exp(cosine(views[k], m) / temperature) for m in queued)
        total = total - torch.log(torch.exp(cosine(views[k], views[partner]) / temperature) / denominator)
    return total / (2 * n)


def clip(image, text, logit_scale: torch.Tensor, image_queue=None, text_queue=None) -> torch.Tensor:
    """CLIP's pseudocode: (CE over texts for each image + CE over images for each text) / 2, logits s cos; each
    image also against the queued texts, each text against the queued images."""
    n = len(image)
    scale = torch.exp(logit_scale)
    texts = list(text) + ([] if text_queue is None else list(text_queue))
    images = list(image) + ([] if image_queue is None else list(image_queue))
    image_to_text, text_to_image = 0.0, 0.0
    for i in range(n):
        row = [scale * cosine(image[i], t) for t in texts]
        column = [scale * cosine(m, text[i]) for m in images]
        image_to_text = image_to_text - torch.log(torch.exp(row[i]) / sum(torch.exp(x) for x in row))
        text_to_image = text_to_image - torch.log(torch.exp(column[i]) / sum(torch.exp(x) for x in column))
    return (image_to_text / n + text_to_image / n) / 2


def siglip(a, b, logit_scale: torch.Tensor, bias: torch.Tensor, a_queue=None, b_queue=None) -> torch.Tensor:
    """SigLIP's Algorithm 1: -1/N sum_i sum_j log sigmoid(y_ij (s a_i.b_j + bias)), y = +1 iff i == j; each
    (a_i, queued b) and (queued a, b_j) pair one more term with y = -1."""
    n = len(a)
    scale = torch.exp(logit_scale)
    pairs = [(a[i], b[j], 1.0 if i == j else -1.0) for i in range(n) for j in range(n)]
    pairs += [(a[i], m, -1.0) for i in range(n) for m in ([] if b_queue is None else b_queue)]
    pairs += [(m, b[j], -1.0) for m in ([] if a_queue is None else a_queue) for j in range(n)]
    total = 0.0
    for u, v, label in pairs:
        logit = scale * cosine(u, v) + bias
        total = total - torch.log(1.0 / (1.0 + torch.exp(-label * logit)))
    return total / n
