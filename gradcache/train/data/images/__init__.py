"""Image data: the sources (`files.py`: digits, an ImageFolder, a caption table; `shapes.py`: the built-in
shapes), the in-memory set and its split (`sets.py`), and SimCLR's augmentations (`augment.py`)."""
