"""`python -m app` opens the Sprig window."""

import sys

from app.main import main

sys.exit(main())
