"""`python -m gradcache ...` runs the `gradcache` command."""
import sys

from gradcache.cli import main

sys.exit(main())
