import sys

from benchmarks.gpu.run import main

sys.exit(main())
