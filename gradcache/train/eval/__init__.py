"""Held-out evaluation with faiss: kNN, cross-modal recall and zero-shot accuracy for images (`images.py`),
passage retrieval for text (`retrieval.py`, `maxsim.py`, `sparse_retrieval.py`), and what each kind of text model
gives for a text, as encode writes it and eval ranks it (`representations.py`). All scores are percentages.
May import: torch, numpy, faiss, the data package; never the loop or the checkpoints."""
