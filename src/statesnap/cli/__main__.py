"""``python -m statesnap.cli``."""

from statesnap.cli import main

main()
