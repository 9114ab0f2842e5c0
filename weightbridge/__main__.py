import sys

from weightbridge.cli.main import main

sys.exit(main())
