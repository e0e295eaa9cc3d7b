"""``flower-dp lrq-keys``: export Gau-LRQ client key files from the server's master secret.

On the deployment engine each SuperNode must hold its own key only (never the master secret): the server's operator
runs ``flower-dp lrq-keys --secret-file SECRET --num-clients N --out DIR`` (or ``--partition-id i`` for one client),
then copies ``DIR/client-<i>.key`` to the machine of SuperNode ``i`` alone and starts it with
``--node-config "partition-id=i num-partitions=N lrq-key-file='/path/client-<i>.key'"`` (docs/flower.md).
"""

from __future__ import annotations

import argparse

from flower_dp.mechanisms.gau_lrq_codec import key_file_name, load_secret, write_client_keys

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "lrq-keys",
        help="export Gau-LRQ client key files (one per client, mode 0600) from the server's master secret",
        description="Writes OUT/client-<i>.key (mode 0600) into OUT (mode 0700) for every client i < N, or for the "
                    "--partition-id given; copy each file to its own SuperNode only and name it in that "
                    "SuperNode's node config: lrq-key-file='...'.  Example: flower-dp lrq-keys "
                    "--secret-file ~/.flower_dp/gau_lrq.secret --num-clients 100 --out keys/",
    )
    p.add_argument("--secret-file", required=True, help="the master secret file GauLRQ(secret_file=...) uses")
    p.add_argument("--num-clients", type=int, required=True, help="N, the number of clients (partition ids 0..N-1)")
    p.add_argument("--out", required=True, help="folder to write the key files into (created, mode 0700)")
    p.add_argument("--partition-id", type=int, action="append", dest="partition_ids",
                   help="export only this client's key (repeatable); default: every client")
    p.set_defaults(func=_cmd)


def _cmd(args: argparse.Namespace) -> int:
    master = load_secret(secret_file=args.secret_file)
    out = write_client_keys(master, args.num_clients, args.out, args.partition_ids)
    ids = range(args.num_clients) if args.partition_ids is None else args.partition_ids
    print(f"wrote {len(list(ids))} client key file(s) into {out} (mode 0600; e.g. {key_file_name(next(iter(ids)))}); "
          "give each SuperNode only its own: --node-config \"lrq-key-file='<path>/client-<i>.key'\"")
    return 0
