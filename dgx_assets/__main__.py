import sys

from dgx_assets.cli import main

sys.exit(main())
