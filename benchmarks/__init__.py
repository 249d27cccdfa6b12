"""The benchmarks of gradcache, run from a checkout as `python -m benchmarks.<name>` (see benchmarks/README.md).

Not installed with the library: they import its public API (`gradcache`, `gradcache.models`) and each other."""
