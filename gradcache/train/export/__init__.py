"""`RUN/model/`: a run's model in the format its users load (sentence-transformers, open_clip, gradcache's
built-in encoders), written at the end of every run and by `gradcache export`. The format writers are what each
mode's `export` calls; `write.py` writes a folder atomically with its model card (`model_card.py`), the mode handed
in, so nothing here imports the modes; gradcache/train/model_folders.py tells any model folder's format."""
