"""Fault probes on a fleet of real processes (`tokenyard up`'s FleetProcesses) on a real
nats-server. Each probe sends streams, breaks something, and tallies every stream (streams.py)
as sent · completed · failed_clean · hung · duplicated · gaps · silent_short.

Probes (`--probe NAME`, repeatable; default all):
  worker-kill      SIGKILL one of 2 workers under 100 concurrent streams, migration on   (kills.py)
  worker-kill-off  the same with `tokenyard router --no-migration`: time to a clean error (kills.py)
  nats-restart     stop the nats-server for 6 s under load, start it again (same store);
                   streams read raw, through TokenyardClient and as SSE via the edge;
                   when each service answers again                                      (nats_restart.py)
  queue-kill       SIGKILL the queue holding ≥ 1,000 queued requests while a standby runs (kills.py)
  overload-rss     10× the fleet's measured capacity over HTTP for --overload-s from
                   several generator processes, bad input mixed in; every process's RSS  (overload.py)
  edge-kill        --layout in-queue (up's default): two fronts (queue processes with the edge,
                   admission and router in them) on one HTTP port, 40 HTTP + 40 NATS streams,
                   SIGKILL the fleet's: its HTTP clients end with an error, the other front's and
                   every NATS client's complete, the survivor serves new ones          (fronts.py)
                   --layout apart: SIGKILL one of a standalone edge's 2 processes under 40 HTTP
                   streams: its clients end with an error, the other's complete, the supervisor
                   restarts it                                                          (replicas.py)
  queue-replica-kill  two queues with admission and router in-process, SIGKILL one mid-load
                   (400 P3 streams): nothing admitted lost, nothing placed twice           (replicas.py)
  chaos            (only when named; --layout as edge-kill) the fleet as `up` runs it plus a standby queue, a steady
                   mixed load (SSE and TokenyardClient, four classes, client aborts), and at
                   seeded random times a worker, an edge process and the queue SIGKILLed and
                   the nats-server restarted, one at a time                                (chaos.py)

    python -m bench.faults [--probe worker-kill ...] [--json docs/results-faults.json]
"""
