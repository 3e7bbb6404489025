"""An impostor of kube-scheduler for the extender's TLS tests (unit and real-cluster).

Its client certificate says CN kube-scheduler and is signed by a CA of the
same name as the extender's (`devcluster.pki.EXTENDER_CA_NAME`): only the CA's
key differs, so a server that checks names instead of signatures would let it in.
"""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path

from chronotope.certs import authority, cert_pem, key_pem
from chronotope.devcluster.pki import EXTENDER_CA_NAME, scheduler_client


def impostor_context(directory: Path, ca_cert: Path) -> ssl.SSLContext:
    """A TLS client that trusts `ca_cert` and presents the impostor's certificate."""
    now = dt.datetime.now(dt.UTC)
    day = dt.timedelta(days=1)
    ca_name, _, ca_key = authority(EXTENDER_CA_NAME, now=now, validity=day)
    cert, key = scheduler_client(ca_name, ca_key, now=now, validity=day)
    (directory / "impostor.crt").write_bytes(cert_pem(cert))
    (directory / "impostor.key").write_bytes(key_pem(key))
    context = ssl.create_default_context(cafile=str(ca_cert))
    context.load_cert_chain(directory / "impostor.crt", directory / "impostor.key")
    return context
