import sys

from cnncompare.cli import main

sys.exit(main())
