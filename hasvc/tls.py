"""TLS for every port: the server's and the client's ``ssl.SSLContext``, and the check of the
certificate and key files a process is given, before it serves (one line naming the file, not
OpenSSL's "PEM lib" from wherever the context was first built). Standard library only."""

from __future__ import annotations

import ssl


def server_ssl_context(*, cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """TLS for a server's port. Peers are authenticated by the HMAC preface (the cluster secret);
    TLS gives confidentiality and lets peers verify us. ``client_ca`` (mutual TLS: a DLedger
    member's Raft port): a peer must also present a certificate that this CA signed."""
    check_tls_files(cert=cert, key=key, ca=client_ca)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key, password=_NO_PASSWORD)
    if client_ca is not None:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_ssl_context(*, ca: str | None, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """TLS to a server, verifying its certificate against ``ca`` (None: the system's CAs), and
    presenting ``cert``/``key`` when given (mutual TLS)."""
    check_tls_files(cert=cert, key=key, ca=ca)
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    context.check_hostname = False  # brokers are addressed by IP; the CA pins who they are
    if cert and key:
        context.load_cert_chain(cert, key, password=_NO_PASSWORD)
    return context


def unverified_client_ssl_context() -> ssl.SSLContext:
    """TLS to a server whose certificate is not checked (a DLedger member given --tls-cert and
    no --tls-ca): the traffic is encrypted against a passive listener, and who the peer is rests
    on the cluster secret's HMAC preface alone."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


# An encrypted private key is refused instead of asking for its passphrase on the terminal.
_NO_PASSWORD = b""


def check_tls_files(*, cert: str | None, key: str | None, ca: str | None) -> None:
    """Read and parse the TLS files a process was given, before it serves: ValueError, one line
    naming the file, when one cannot be read, holds no PEM certificate (``cert``, ``ca``), holds
    no usable PEM private key, or when the key does not match the certificate. Without this an
    unparseable file surfaced as OpenSSL's "PEM lib" from wherever the context was first built."""
    for path, what in ((cert, "certificate"), (ca, "CA certificate")):
        if path is not None:
            _load_certificates(path, what)
    if cert is None or key is None:
        return
    try:
        with open(key, "rb"):
            pass
    except OSError as error:
        raise ValueError(f"cannot read the TLS private key {key}: {error.strerror or error}") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=_NO_PASSWORD)
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            raise ValueError(f"the TLS private key {key} does not match the certificate {cert}") from None
        raise ValueError(f"the TLS private key {key} holds no PEM private key OpenSSL can use (an encrypted key is "
                         "refused: no passphrase is asked for)") from None  # fmt: skip


def _load_certificates(path: str, what: str) -> None:
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise ValueError(f"cannot read the TLS {what} {path}: {error.strerror or error}") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cadata=data.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError):
        raise ValueError(f"the TLS {what} {path} holds no PEM certificate OpenSSL can parse") from None
