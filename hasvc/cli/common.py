"""What several command groups share: the client options and a record as JSON."""

from __future__ import annotations

import base64

import click

secret_option = click.option("--secret-file", type=click.Path(dir_okay=False, exists=True), help="Cluster secret (or HASVC_SECRET).")
tls_option = click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True), help="CA to verify a TLS broker.")


def client_secret(secret_file):
    from hasvc.config import read_secret

    return read_secret(secret_file)


def record_json(offset: int, record, crc_ok: bool) -> dict:
    return {
        "offset": offset,
        "size": record.size,
        "topic": record.topic,
        "queue_id": record.queue_id,
        "queue_offset": record.queue_offset,
        "flag": record.flag,
        "sysflag": record.sysflag,
        "properties": record.properties,
        "born_timestamp": record.born_timestamp,
        "born_host": f"{record.born_host[0]}:{record.born_host[1]}",
        "store_timestamp": record.store_timestamp,
        "store_host": f"{record.store_host[0]}:{record.store_host[1]}",
        "reconsume_times": record.reconsume_times,
        "body_crc": record.body_crc,
        "crc_ok": crc_ok,
        "body_base64": base64.b64encode(bytes(record.body)).decode(),
    }
