"""``scontrol`` for the fake slurmrestd's slurmctld: ``python -m fakes.scontrol URL requeue JOB``.

Slurm up to 24.11 has no REST requeue, so the REST job path requeues through
``scontrol requeue``; against the fake this command asks the fake's slurmctld
state and prints what 22.05's scontrol prints, with its exit status.
"""

from __future__ import annotations

import json
import sys
import urllib.request


def main(argv: list[str]) -> int:
    """Run ``scontrol ARGS`` against the fake at ``argv[0]``."""
    url, args = argv[0], argv[1:]
    request = urllib.request.Request(
        f"{url}/fake/scontrol",
        data=json.dumps(args).encode(),
        headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": "token-root"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            answer = json.loads(resp.read())
    except OSError as err:
        print(f"scontrol: error: Unable to contact slurm controller: {err}", file=sys.stderr)
        return 1
    if answer["stdout"]:
        print(answer["stdout"])
    if answer["stderr"]:
        print(answer["stderr"], file=sys.stderr)
    return int(answer["rc"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
