"""Command-line plumbing shared by the subcommands (``inspect``, ``export``)."""

from __future__ import annotations

import argparse
from typing import NoReturn

from utils.errors import InputError


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` whose usage errors are one-line ``InputError``s: the command line prints them and exits 2."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{message} (see {self.prog} --help)")
