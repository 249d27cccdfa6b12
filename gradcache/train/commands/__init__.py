"""`gradcache encode`, `gradcache eval MODEL --data FILE` and `gradcache mine`: the commands around training.

`model.py` resolves the MODEL argument all three take (a run folder or checkpoint, a sentence-transformers or
Hugging Face folder, the packaged all-MiniLM-L6-v2) into one `LoadedModel`; `command_inputs.py` reads what they
embed (texts, images, a corpus of id/text rows) with the training program's own readers; `encode.py`,
`evaluate.py` and `mine.py` do each command's work; `command_outputs.py` writes their outputs atomically;
`command_options.py` holds their options. `gradcache/train/cli.py` only registers them.
"""
