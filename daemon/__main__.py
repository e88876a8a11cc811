import sys

from csmd.cli import main

sys.exit(main())
