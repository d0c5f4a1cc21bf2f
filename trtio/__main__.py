import sys

from trtio._cli import main

sys.exit(main())
