"""`multinode preview`: print the job script a rule would get, without submitting anything."""
from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("preview", help="print the exact job script for given resources (submits nothing)")
    p.set_defaults(func=lambda args: 0)
