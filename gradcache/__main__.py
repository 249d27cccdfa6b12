"""`python -m gradcache ...` runs the `gradcache` command."""
import sys

from gradcache.train.cli import main

sys.exit(main())
