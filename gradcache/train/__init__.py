"""The training program behind `gradcache train` and `gradcache eval` (see README.md beside this file)."""
