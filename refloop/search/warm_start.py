"""Imported first by `refloop.cli`: `refloop worker` and `refloop up` start loading the
search model and LanceDB here, before the command line imports anything heavy."""

import os
import sys

from refloop.search.runtime import start_warm_up_for_command

start_warm_up_for_command(sys.argv[1:], dict(os.environ))
