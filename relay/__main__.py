import os
import sys

# `python -m relay` puts the current directory first on sys.path: from a shared folder, a
# planted argparse.py or zmq.py would run in the relay (issue 62.7). Nothing else is imported
# before this line drops it (`ftis-relay` and `python -P -m relay` never add it).
if not sys.flags.safe_path and sys.path and os.path.realpath(sys.path[0] or ".") == os.path.realpath(os.getcwd()):
    sys.path.pop(0)

from relay.cli import main  # noqa: E402

sys.exit(main())
