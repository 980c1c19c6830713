import sys

from serving.server import main

sys.exit(main())
