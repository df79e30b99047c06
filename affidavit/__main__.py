import sys

from affidavit.cli import main

sys.exit(main())
