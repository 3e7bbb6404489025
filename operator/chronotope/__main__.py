"""Allow `python -m chronotope`."""

from chronotope.cli import main

raise SystemExit(main())
