"""`from gradcache.cli import main`: the `gradcache` command, whose command line is gradcache/train/cli.py."""
from gradcache.train.cli import main

__all__ = ["main"]
