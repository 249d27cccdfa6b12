"""Image data: the sources (`files.py`: digits, an ImageFolder, a caption table; `shapes.py`: the built-in
shapes; `shards.py`: webdataset tar shards), the in-memory set and its split (`sets.py`), the set of files decoded
when drawn and the bad-data count as a run goes (`lazy.py`), SimCLR's augmentations (`augment.py`), and the
training batches drawn in the run's order (`training_batches.py`)."""
