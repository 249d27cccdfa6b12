"""Scoring a run's model on its held-out split, and the baselines that show what training bought.

SimCLR: `knn_top1` of the backbone features, beside `knn_top1_raw_pixels` and `knn_top1_random_init` (the same
architecture as initialised by the run's seed, i.e. the model at step 0). CLIP: recall@1/5/10 both ways with
their chance levels, and `zero_shot_top1` where the data has classes. Every evaluation runs in eval mode, without
gradients and without touching the global random state, so evaluating during a run does not change the run.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from gradcache.train.evaluate import (
    embed_images,
    embed_texts,
    knn_top1,
    pixel_features,
    retrieval_recall,
    zero_shot_top1,
)
from gradcache.train.image_set import DataSplits
from gradcache.train.recipe import build_model


def _knn(args: argparse.Namespace, train: np.ndarray, test: np.ndarray, data: DataSplits) -> float:
    return knn_top1(train, data.train.labels, test, data.test.labels, k=args.knn_k, temperature=args.knn_temperature)


def evaluate_model(args: argparse.Namespace, model: nn.Module, data: DataSplits, tokenizer: Callable | None,
                   device: torch.device) -> dict[str, float]:
    """The run's held-out metrics (percentages) for `model` as it is now."""
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.inference_mode():
            if args.mode == "simclr":
                train = embed_images(model.embed, data.train.images, device)
                test = embed_images(model.embed, data.test.images, device)
                return {"knn_top1": _knn(args, train, test, data)}
            return _clip_metrics(model, data, tokenizer, device)
    finally:
        model.train(was_training)


def _clip_metrics(model: nn.Module, data: DataSplits, tokenizer: Callable, device: torch.device) -> dict[str, float]:
    images = embed_images(model.encode_image, data.test.images, device)
    texts = embed_texts(model.encode_text, tokenizer, data.test.captions, device)
    metrics = retrieval_recall(images, texts, data.test.captions)
    if data.test.labels is not None and data.test.class_names:
        prompts = data.test.class_prompts or [[f"a photo of a {name}"] for name in data.test.class_names]
        classes = np.stack([embed_texts(model.encode_text, tokenizer, p, device).mean(0) for p in prompts])
        classes /= np.linalg.norm(classes, axis=1, keepdims=True)
        metrics["zero_shot_top1"] = zero_shot_top1(images, data.test.labels, classes)
    return metrics


def baseline_metrics(args: argparse.Namespace, data: DataSplits, device: torch.device) -> dict[str, float]:
    """SimCLR: kNN on raw pixels and on the randomly initialised model; CLIP: nothing beyond chance levels."""
    if args.mode != "simclr":
        return {}
    train, test = pixel_features(data.train.images, data.test.images)
    metrics = {"knn_top1_raw_pixels": _knn(args, train, test, data)}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)  # the same draw as the run's initial model
        initial = build_model(args).to(device)
    metrics["knn_top1_random_init"] = evaluate_model(args, initial, data, None, device)["knn_top1"]
    return metrics
