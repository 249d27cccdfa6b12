"""`gradcache encode`, `gradcache eval MODEL --data FILE`, `gradcache mine` and `gradcache export`: the commands around
training.

`model.py` resolves the MODEL argument the first three take (a run folder or checkpoint, a model folder, the
packaged all-MiniLM-L6-v2) into one `LoadedModel` (gradcache/train/modes/loaded_model.py), made by the mode or kind
that reads it; `command_inputs.py` reads what they embed (texts, images, a corpus of id/text rows) with the training
program's own readers; `encode.py`, `evaluate.py` and `mine.py` do each command's work, asking the model's kind
what differs (how it embeds texts, whether it ranks passages or mines); `export.py` rebuilds a checkpoint's model for
gradcache/train/export/; `command_outputs.py` writes their outputs atomically; `command_options.py` holds their
options. `gradcache/train/cli.py` only registers them.
"""
