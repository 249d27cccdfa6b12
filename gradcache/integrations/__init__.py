"""GradCache inside trainers you already use; one thin module per trainer, each importing its trainer when it
is imported (never when `gradcache` is), and naming the extra to install when the trainer is missing:

- `gradcache.integrations.huggingface`: `GradCacheTrainer`, a `transformers.Trainer` whose model is a
  `CachedLoss` (`pip install "gradcache[huggingface]"`).
- `gradcache.integrations.lightning`: `GradCacheModule`, a `LightningModule` whose `training_step` returns
  `CachedLoss`'s loss (`pip install "gradcache[lightning]"`).
- `gradcache.integrations.sentence_transformers`: `GradCacheLoss`, a loss for `SentenceTransformerTrainer`
  and `model.fit` (`pip install "gradcache[sentence-transformers]"`).
- `gradcache.integrations.open_clip`: `build_open_clip`, the two towers, tokenizer and preprocessing of an
  open_clip architecture, built without a download (`pip install "gradcache[open-clip]"`).
"""
