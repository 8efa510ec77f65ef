"""``main.py`` for the tests of a population sharded over processes (tests/training/test_sharded.py).

Run by the tests, directly or under ``torchrun``, it first:

* writes this process's id to ``$SHARDED_PIDS/rank-<RANK>.pid`` (when set), so a test can signal one rank;
* crowns the best validation agent every generation (three smoke generations rarely prove an edge, and the
  tests must see a champion move from the rank that holds it);
* with ``$HOLD_POINTS`` set, holds every rank where ``$HOLD_AT`` says until the test releases it
  (``tests/hold_points.py``), so a test can strike while every rank is provably still training;
* with ``$SHARDED_LOG`` a folder, records there what crossed between ranks: ``fetched-<RANK>`` gets the count of
  rows each evolution fetched, ``champion-<RANK>`` the rank each crowned champion came from.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    import main
    from tests import hold_points
    from training import loop as trainer

    if os.environ.get("SHARDED_PIDS"):
        Path(os.environ["SHARDED_PIDS"], f"rank-{os.environ.get('RANK', '0')}.pid").write_text(str(os.getpid()))
    trainer.choose_champion = lambda edges, *_, **__: int(edges.argmax())
    if os.environ.get("SHARDED_LOG"):
        from runtime.sharding import Sharding

        log = Path(os.environ["SHARDED_LOG"])
        rank = os.environ.get("RANK", "0")
        fetch_rows, broadcast_ = Sharding.fetch_rows, Sharding.broadcast_

        def logged_fetch(self: Sharding, tensors, needs):
            with open(log / f"fetched-{rank}", "a") as f:
                f.write(f"{len(needs[self.ranks.rank])}\n")
            return fetch_rows(self, tensors, needs)

        def logged_broadcast(self: Sharding, tensors, *, src):
            with open(log / f"champion-{rank}", "a") as f:
                f.write(f"{src}\n")
            return broadcast_(self, tensors, src=src)

        Sharding.fetch_rows, Sharding.broadcast_ = logged_fetch, logged_broadcast
    hold_points.install()
    main.exit_process(main.main(sys.argv[1:]))
