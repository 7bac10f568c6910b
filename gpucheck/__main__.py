import sys

from gpucheck.driver import main

sys.exit(main())
