"""A child process of client_test.py's ReconnectTest: one member of a job, with
gRPC's backup poller off (set before grpc is imported, which is when gRPC reads
it), heartbeating until its stdin closes.

    member_child.py ADDRESS JOB WORKER_ID
"""

import os
import sys

os.environ["GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS"] = "0"

import shardline  # noqa: E402
from shardline.member import Member  # noqa: E402


def main():
    address, job, worker_id = sys.argv[1:4]
    conn = shardline.Connection(address, timeout=5)
    member = Member(conn, job, worker_id, incarnation=7)
    member.join()
    print("joined", flush=True)
    sys.stdin.read()  # until the parent closes it
    member.close()
    conn.close()


if __name__ == "__main__":
    main()
