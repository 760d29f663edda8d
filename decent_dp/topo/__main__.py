"""``python -m decent_dp.topo``: every registered topology's mixing properties, as a table."""

from . import main

main()
