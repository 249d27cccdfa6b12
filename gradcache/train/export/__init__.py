"""`RUN/model/`: a run's model in the format its users load (sentence-transformers, open_clip, gradcache's
built-in encoders), written at the end of every run and by `gradcache export`; gradcache/train/model_folders.py tells
any model folder's format."""
