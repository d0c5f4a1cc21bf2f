import sys

from trtio.cli import main

sys.exit(main())
