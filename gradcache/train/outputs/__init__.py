"""The files the commands write for users to read, as formats of their own (docs/outputs.md): a SPLADE model's
sparse rows in CSR form and their `.npz` (`sparse_rows.py`), which `encode` writes and `eval` scores.
May import: numpy, torch; nothing else of the program."""
