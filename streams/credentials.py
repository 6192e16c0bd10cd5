"""The Faust app's Kafka credentials, from the deployment's settings (SASL, TLS or none)."""

from __future__ import annotations

from typing import Any

import faust

from rewardflow.settings import Settings


def faust_credentials(s: Settings) -> Any:
    """Faust's credentials for the deployment's Kafka security settings (None: plaintext)."""
    if s.kafka_security_protocol.startswith("SASL") and s.kafka_sasl_password is not None:
        # without an ssl_context Faust speaks SASL_PLAINTEXT, even when SASL_SSL is configured
        return faust.SASLCredentials(
            username=s.kafka_sasl_username, password=s.kafka_sasl_password.get_secret_value(),
            mechanism=s.kafka_sasl_mechanism,
            ssl_context=_tls_context(s) if s.kafka_security_protocol == "SASL_SSL" else None,
        )
    if s.kafka_security_protocol == "SSL":
        return faust.SSLCredentials(_tls_context(s))
    return None


def _tls_context(s: Settings) -> Any:
    import ssl

    return ssl.create_default_context(cafile=str(s.kafka_ssl_cafile) if s.kafka_ssl_cafile else None)
