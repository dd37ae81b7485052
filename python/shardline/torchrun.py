"""`python3 -m shardline.torchrun ...`: torchrun with the "shardline"
rendezvous backend registered.

Debian's torch 1.13 has no plugin discovery for rendezvous backends, so
this runs torch.distributed.run's main after registering the handler
(shardline/torch/rendezvous.py). Every torchrun argument works as with
torchrun; `--rdzv_backend shardline` is the default here, and so is
`--monitor_interval 0.5` (torch 1.13's default is 5 s; see main()). torch >= 2.5
also finds the backend through the `torchrun.handlers` entry point of the
installed package, so plain `torchrun --rdzv-backend shardline` works.

    python3 -m shardline.torchrun --nnodes 2:3 --nproc_per_node 1 \\
        --rdzv_endpoint 127.0.0.1:7070 --rdzv_id demo --max_restarts 3 train.py
"""

import sys
import time

# Seconds between the agent's checks of its workers and of
# num_nodes_waiting(), unless --monitor_interval is given.
DEFAULT_MONITOR_INTERVAL_S = 0.5


def _fix_std_from_str() -> None:
    """Debian's torch 1.13 under Python 3.11: Std.from_str("0") returns None
    (IntFlag iteration skips the zero member), so every torchrun start fails
    in start_processes ("'NoneType' object has no attribute 'get'"). Later
    torch parses the digits as Std(int(v)); do the same where it is broken."""
    import re
    from torch.distributed.elastic.multiprocessing import api
    if api.Std.from_str("0") is not None:
        return

    def from_str(vm):
        if re.fullmatch(r"\d", vm):
            return api.Std(int(vm))
        return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}

    api.Std.from_str = staticmethod(from_str)


# The rendezvous's join_timeout when rdzv_conf does not give one
# (python/shardline/torch/rendezvous.py).
DEFAULT_JOIN_TIMEOUT_S = 600.0


def _join_timeout(rdzv_conf) -> float:
    """join_timeout of an --rdzv_conf "k=v,k=v" value, in seconds; the default
    when it is absent or not a positive number (the handler then refuses the
    value itself, naming it)."""
    for item in (rdzv_conf or "").split(","):
        key, _, value = item.partition("=")
        if key.strip() == "join_timeout":
            try:
                seconds = float(value)
            except ValueError:
                return DEFAULT_JOIN_TIMEOUT_S
            return seconds if 0 < seconds < float("inf") else DEFAULT_JOIN_TIMEOUT_S
    return DEFAULT_JOIN_TIMEOUT_S


def _given(args, names):
    """The values torchrun's own parser reads for `names` (None where the
    command line leaves them at torchrun's default): the flags of the
    training script after its path are not ours to read."""
    from torch.distributed import run
    parser = run.get_args_parser()
    parser.set_defaults(**{n: None for n in names})
    known, _ = parser.parse_known_args(args)
    return {n: getattr(known, n) for n in names}


def main(argv=None) -> None:
    from torch.distributed.elastic.rendezvous import api as rdzv_api
    from shardline import errors
    from shardline.torch import rendezvous
    _fix_std_from_str()
    rendezvous.register()
    from torch.distributed import run
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args[:1]) or args[:1] == []:
        print("shardline.torchrun: torchrun with --rdzv_backend shardline and "
              "--monitor_interval %.1f by default; rdzv_conf keys of the backend: %s "
              "(python/shardline/torch/rendezvous.py)\n"
              % (DEFAULT_MONITOR_INTERVAL_S, ", ".join(rendezvous.CONF_KEYS)))
    given = _given(args, ("rdzv_backend", "monitor_interval", "rdzv_conf"))
    if given["rdzv_backend"] is None:
        args = ["--rdzv_backend", rendezvous.BACKEND_NAME] + args
    if given["monitor_interval"] is None:
        # The agent learns of a re-form by polling num_nodes_waiting() once
        # per monitor interval; ours reads a flag the Session stream keeps
        # current (no RPC), so polling twice a second costs nothing and
        # bounds that part of a recovery to 0.5 s (torch 1.13's default: 5 s).
        args = ["--monitor_interval", str(DEFAULT_MONITOR_INTERVAL_S)] + args
    join_timeout = _join_timeout(given["rdzv_conf"])
    first_end = None
    while True:
        try:
            run.main(args)
            return
        except errors.AbortedError as e:
            # The round ended (a node joined or was lost) while torch's agent
            # was still exchanging its ranks through the round's store, after
            # next_rendezvous: torch lets that error end the agent. No worker
            # of that round has started, so the agent runs again and joins
            # the next round (its handler left the job on the way out).
            # Agents that start or re-join seconds apart can end several
            # rounds in a row (each late join ends the round the others had
            # formed), so the bound is the rendezvous's own: join_timeout
            # from the first such end, not a count (3 ran out under load).
            now = time.monotonic()
            first_end = now if first_end is None else first_end
            if now - first_end > join_timeout:
                print("shardline.torchrun: error: %s: %s" % (type(e).__name__, e),
                      file=sys.stderr)
                sys.exit(1)
            print("shardline.torchrun: the round ended while the agent assigned ranks (%s); "
                  "joining the next round" % e, file=sys.stderr)
        except (rdzv_api.RendezvousError, errors.ShardlineError, ValueError) as e:
            # One line that names the cause, not the agent's traceback.
            print("shardline.torchrun: error: %s: %s" % (type(e).__name__, e), file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
